"""Train the StepWiser judge on a snapshot with TRL's GRPOTrainer, recorded in the database.

The run's life (identity by output directory, lease, resume, how it ended) is
``runs.recorded_run``'s; this module builds the dataset, the rewards and the trainer.  The
final model is saved to ``OUTPUT/final``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepq.models import Database
from stepq.models import training_queries as tq
from stepq.models.errors import ConfigError
from stepq.models.snapshots import TRAIN
from stepq.trainer.judge.prompt import JudgePrompt
from stepq.trainer.judge.rewards import get_rewards
from stepq.trainer.snapshots.export import snapshot_records
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.records import ClassAccuracy, make_recorder
from stepq.trainer.training.runs import FINAL, RunHandle, RunSpec, TrainOptions, TrainResult, recorded_run

__all__ = ["FINAL", "TrainOptions", "TrainResult", "judge_dataset", "train_judge"]
log = logging.getLogger(__name__)


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


def train_judge(
    db: Database,
    snapshot: str | int,
    recipe: Recipe,
    output_dir: Path,
    options: TrainOptions | None = None,
    on_step: Callable[[], None] | None = None,
) -> TrainResult:
    """Train (or resume, or report as done) the GRPO run that writes to ``output_dir``."""
    options = options or TrainOptions()
    output_dir = output_dir.resolve()
    base_model = options.base_model or recipe.model
    with db.session() as session:
        snapshot_id = tq.get_snapshot(session, snapshot).id
    spec = RunSpec("grpo", recipe.text, base_model, output_dir, snapshot_id=snapshot_id)

    def body(handle: RunHandle) -> tuple[str | None, int]:
        from transformers.trainer_utils import get_last_checkpoint
        from trl import GRPOTrainer

        dataset = judge_dataset(db, snapshot, recipe)
        accuracy = ClassAccuracy()
        rewards: list[Any] = [accuracy.wrap(fn) if i == 0 else fn for i, fn in enumerate(get_rewards(recipe.rewards))]
        config = recipe.grpo_config(output_dir, **(options.trainer_overrides or {}))
        resume = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
        if resume:
            handle.count_resume(db)
            log.info("training run %s resumes from %s", handle.run_id, resume)
        recorder = make_recorder(db, handle.run_id, handle.owner, handle.ttl, accuracy, on_step)
        trainer = GRPOTrainer(
            model=base_model, reward_funcs=rewards, args=config, train_dataset=dataset, callbacks=[recorder]
        )
        trainer.train(resume_from_checkpoint=resume)
        final = output_dir / FINAL
        trainer.save_model(str(final))
        if trainer.processing_class is not None:
            trainer.processing_class.save_pretrained(str(final))
        return resume, int(trainer.state.global_step)

    return recorded_run(db, spec, options, body)
