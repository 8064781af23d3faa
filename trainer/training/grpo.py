"""Train the StepWiser judge on a snapshot with TRL's GRPOTrainer, recorded in the database.

A run is identified by its output directory: starting the same training again (after a
crash, a kill, a pre-empted node) takes over the same run row and resumes from the last
checkpoint in that directory.  The final model is saved to ``OUTPUT/final``.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepq.models import Database
from stepq.models import training_queries as tq
from stepq.models.errors import ConfigError, TrainingBusy
from stepq.models.snapshots import TRAIN
from stepq.models.training import RUN_DONE
from stepq.trainer.judge.prompt import JudgePrompt
from stepq.trainer.judge.rewards import get_rewards
from stepq.trainer.snapshots.export import snapshot_records
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.records import ClassAccuracy, make_recorder, process_owner

log = logging.getLogger(__name__)
FINAL = "final"


@dataclass(frozen=True)
class TrainOptions:
    lease_ttl_s: float = 120.0
    wait_s: float = 0.0
    """How long to wait for another trainer's lease on the same run before giving up."""
    lineage: str | None = None
    base_model: str | None = None
    """Start from this model instead of the recipe's (the service continues its lineage)."""
    trainer_overrides: dict[str, Any] | None = None


@dataclass(frozen=True)
class TrainResult:
    run_id: int
    status: str
    resumed_from: str | None
    final_model: Path
    global_step: int


def judge_dataset(db: Database, snapshot: str | int, recipe: Recipe) -> Any:
    """The snapshot's train split as TRL prompts, with ``label`` for the rewards."""
    from datasets import Dataset

    template = JudgePrompt.load(recipe.judge_template) if recipe.judge_template else None
    rows = snapshot_records(db, snapshot, template)[TRAIN]
    if not rows:
        raise ConfigError(f"snapshot {snapshot} has no training rows")

    def prompt(text: str) -> Any:
        return [{"role": "user", "content": text}] if recipe.conversational else text

    return Dataset.from_list([{"prompt": prompt(r["prompt"]), "label": r["label"]} for r in rows])


def _claim(db: Database, run_id: int, owner: str, options: TrainOptions) -> None:
    deadline = time.monotonic() + options.wait_s
    while True:
        with db.session() as session:
            if tq.claim_run(session, run_id, owner, options.lease_ttl_s, socket.gethostname()):
                return
            holder = tq.get_run(session, run_id)
        if time.monotonic() >= deadline:
            raise TrainingBusy(f"training run {run_id} is being trained by {holder.lease_owner}; try again later")
        time.sleep(min(2.0, max(0.2, options.lease_ttl_s / 10)))


def train_judge(
    db: Database,
    snapshot: str | int,
    recipe: Recipe,
    output_dir: Path,
    options: TrainOptions | None = None,
    on_step: Callable[[], None] | None = None,
) -> TrainResult:
    """Train (or resume, or report as done) the run that writes to ``output_dir``."""
    options = options or TrainOptions()
    output_dir = output_dir.resolve()
    base_model = options.base_model or recipe.model
    with db.session() as session:
        snap = tq.get_snapshot(session, snapshot)
        existing = tq.run_by_output(session, str(output_dir))
        if existing is not None and existing.snapshot_id != snap.id:
            raise ConfigError(
                f"{output_dir} belongs to training run {existing.id} on snapshot {existing.snapshot_id}; "
                "choose another --output"
            )
        if existing is not None and existing.status == RUN_DONE:
            return TrainResult(existing.id, RUN_DONE, None, output_dir / FINAL, existing.global_step)
        run_id = tq.create_run(
            session,
            snapshot_id=snap.id,
            method="grpo",
            lineage=options.lineage,
            recipe=recipe.text,
            base_model=base_model,
            output_dir=str(output_dir),
            host=socket.gethostname(),
        )
    owner = process_owner()
    _claim(db, run_id, owner, options)
    try:
        result = _run(db, run_id, owner, snapshot, recipe, output_dir, base_model, options, on_step)
    except BaseException as exc:
        if not isinstance(exc, KeyboardInterrupt | SystemExit):
            with db.session() as session:
                tq.end_run(session, run_id, owner, error=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    with db.session() as session:
        tq.end_run(session, run_id, owner)
    return result


def _run(
    db: Database,
    run_id: int,
    owner: str,
    snapshot: str | int,
    recipe: Recipe,
    output_dir: Path,
    base_model: str,
    options: TrainOptions,
    on_step: Callable[[], None] | None,
) -> TrainResult:
    from transformers.trainer_utils import get_last_checkpoint
    from trl import GRPOTrainer

    dataset = judge_dataset(db, snapshot, recipe)
    accuracy = ClassAccuracy()
    rewards: list[Any] = [accuracy.wrap(fn) if i == 0 else fn for i, fn in enumerate(get_rewards(recipe.rewards))]
    config = recipe.grpo_config(output_dir, **(options.trainer_overrides or {}))
    resume = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
    if resume:
        with db.session() as session:
            run = tq.get_run(session, run_id)
            tq.renew_run(session, run_id, owner, options.lease_ttl_s, resumes=run.resumes + 1)
        log.info("training run %s resumes from %s", run_id, resume)
    recorder = make_recorder(db, run_id, owner, options.lease_ttl_s, accuracy, on_step)
    trainer = GRPOTrainer(
        model=base_model, reward_funcs=rewards, args=config, train_dataset=dataset, callbacks=[recorder]
    )
    trainer.train(resume_from_checkpoint=resume)
    final = output_dir / FINAL
    trainer.save_model(str(final))
    if trainer.processing_class is not None:
        trainer.processing_class.save_pretrained(str(final))
    with db.session() as session:
        tq.renew_run(session, run_id, owner, options.lease_ttl_s, global_step=int(trainer.state.global_step))
    return TrainResult(run_id, RUN_DONE, resume, final, int(trainer.state.global_step))
