"""The one executor of a training run, the same for every method.

A method describes its run (``RunPlan``: what it trains on, the trainer class and its
arguments, the files it keeps beside the model); ``execute`` carries the plan out, in one
straight line: the run row, its lease, the checkpoint to resume from, the trainer, training,
the final model, the side files, the end.  A method is never called back.

A run is identified by its output directory: starting the same training again (after a
crash, a kill, a pre-empted node) takes over the same run row and resumes from the last
checkpoint in that directory.  One process at a time holds the run's lease; a second one
waits up to ``wait_s`` and then fails with ``TrainingBusy``.  Under a multi-process launch
rank 0 owns the row; the other ranks train beside it and write nothing (``ranks``).
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import ConfigError, TrainingBusy
from stepq.models.training import RUN_DONE
from stepq.trainer.training.ranks import current_rank
from stepq.trainer.training.recipe import check_base_model
from stepq.trainer.training.records import ClassAccuracy, make_recorder, process_owner

FINAL = "final"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainOptions:
    lease_ttl_s: float = 120.0
    wait_s: float = 0.0
    """How long to wait for another trainer's lease on the same run before giving up."""
    lineage: str | None = None
    base_model: str | None = None
    """Start from this model instead of the recipe's (the service continues its lineage)."""
    trainer_overrides: dict[str, Any] | None = None
    on_step: Callable[[], None] | None = None
    """Called after every optimizer step (the service renews its own lease with it)."""


@dataclass(frozen=True)
class TrainResult:
    run_id: int
    status: str
    resumed_from: str | None
    final_model: Path
    global_step: int


@dataclass(frozen=True)
class RunSpec:
    """What a run trains on and how: the snapshot (``snapshot_id``), a dataset named by
    ``dataset`` (a set's pairs or outcomes, an export), or a snapshot's labels in a form the
    dataset names (the step-label PRM's)."""

    method: str
    recipe_text: str
    base_model: str
    output_dir: Path
    snapshot_id: int | None = None
    dataset: str | None = None


@dataclass(frozen=True)
class RunPlan:
    """A method's description of its run, which ``execute`` carries out.

    ``trainer`` is built as ``trainer(**arguments, callbacks=[recorder])`` and trained with
    ``train(resume_from_checkpoint=...)``, then ``save_model``: a TRL trainer, or stepq's own
    with the same surface (the PRM's).  A trainer class that keeps its checkpoints its own
    way says where the last one is (``last_checkpoint(output_dir)``); otherwise
    transformers' rule applies.  ``side_files`` are JSON documents kept beside the run and its
    final model, each stamped with the run that wrote it (``source``)."""

    spec: RunSpec
    trainer: Callable[..., Any]
    arguments: Mapping[str, Any]
    max_steps: int = 0
    """The config's plan (0: the trainer decides): a run killed after its last checkpoint is done."""
    side_files: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    accuracy: ClassAccuracy | None = None
    """Per-class accuracy the trainer's reward counts (GRPO), recorded with each log."""
    one_process: bool = False
    """The trainer runs in one process only (refused under a multi-process launch)."""


@dataclass(frozen=True)
class RunHandle:
    """The run as one process of its launch sees it: the main rank holds the row's lease
    (``run_id`` set); the other ranks of a multi-process launch follow (``run_id`` None) and
    every database write of theirs is a no-op."""

    run_id: int | None
    owner: str
    ttl: float

    @property
    def owns_row(self) -> bool:
        return self.run_id is not None

    def count_resume(self, db: Database) -> None:
        if self.run_id is None:
            return
        with db.session() as session:
            run = queries.get_run(session, self.run_id)
            queries.renew_run(session, self.run_id, self.owner, self.ttl, resumes=run.resumes + 1)


def execute(db: Database, plan: RunPlan, options: TrainOptions) -> TrainResult:
    """Create or take over the run writing to the plan's output folder and carry the plan out
    under its lease; a failure keeps its error on the row.  A finished run is reported, not
    trained again."""
    spec = plan.spec
    output_dir = spec.output_dir.resolve()
    rank = current_rank()
    if plan.one_process and rank.distributed:
        raise ConfigError(
            f"the {spec.method} trainer runs in one process; start 'stepq train --method {spec.method}' "
            "without torchrun or accelerate launch"
        )
    check_base_model(spec.base_model)
    if not rank.is_main:
        return _follow(db, plan, options)
    with db.session() as session:
        existing = queries.run_by_output(session, str(output_dir))
        if existing is not None and (existing.snapshot_id, existing.dataset) != (spec.snapshot_id, spec.dataset):
            trained_on = f"snapshot {existing.snapshot_id}" if existing.snapshot_id else existing.dataset
            raise ConfigError(
                f"{output_dir} belongs to training run {existing.id} on {trained_on}; choose another --output"
            )
        if existing is not None and existing.method != spec.method:
            raise ConfigError(f"{output_dir} belongs to a {existing.method} run; choose another --output")
        if existing is not None and existing.status == RUN_DONE:
            _require_model(existing.id, output_dir / FINAL, plan)
            return TrainResult(existing.id, RUN_DONE, None, output_dir / FINAL, existing.global_step)
        run_id = queries.create_run(
            session,
            snapshot_id=spec.snapshot_id,
            dataset=spec.dataset,
            method=spec.method,
            lineage=options.lineage,
            recipe=spec.recipe_text,
            base_model=spec.base_model,
            output_dir=str(output_dir),
            host=socket.gethostname(),
        )
    handle = RunHandle(run_id, process_owner(), options.lease_ttl_s)
    _claim(db, handle, options.wait_s)
    try:
        resumed, step = _train(db, plan, options, handle, output_dir)
    except BaseException as exc:
        if not isinstance(exc, KeyboardInterrupt | SystemExit):
            with db.session() as session:
                queries.end_run(session, run_id, handle.owner, error=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    with db.session() as session:
        queries.renew_run(session, run_id, handle.owner, handle.ttl, global_step=step)
        queries.end_run(session, run_id, handle.owner)
    return TrainResult(run_id, RUN_DONE, resumed, output_dir / FINAL, step)


def _require_model(run_id: int, final: Path, plan: RunPlan) -> None:
    """A finished run is reported, not trained again: only while the model it saved is there
    (reporting a folder of side files as a trained model would hand the caller nothing)."""
    kept = [f.name for f in final.iterdir()] if final.is_dir() else []
    if not [name for name in kept if name not in plan.side_files]:
        raise ConfigError(
            f"training run {run_id} finished, but its model is gone from {final}: restore the folder, "
            "or train into another --output"
        )


def _follow(db: Database, plan: RunPlan, options: TrainOptions) -> TrainResult:
    """A non-main rank: train beside rank 0 and write nothing.  A finished run is done for
    every rank (rank 0 returns without training, so the others must too)."""
    output_dir = plan.spec.output_dir.resolve()
    with db.session() as session:
        existing = queries.run_by_output(session, str(output_dir))
    if existing is not None and existing.status == RUN_DONE and existing.method == plan.spec.method:
        return TrainResult(existing.id, RUN_DONE, None, output_dir / FINAL, existing.global_step)
    resumed, step = _train(db, plan, options, RunHandle(None, process_owner(), 0.0), output_dir)
    with db.session() as session:
        row = queries.run_by_output(session, str(output_dir))
    return TrainResult(row.id if row else 0, RUN_DONE, resumed, output_dir / FINAL, step)


def _train(
    db: Database, plan: RunPlan, options: TrainOptions, handle: RunHandle, output_dir: Path
) -> tuple[str | None, int]:
    """Resume from the last checkpoint in ``output_dir`` if any, write the side files, train
    the plan's trainer, save the final model (and its tokenizer) and the side files to
    ``OUTPUT/final``.  Returns (the checkpoint it resumed from or None, the final step)."""
    resume = _last_checkpoint(plan.trainer, output_dir) if output_dir.is_dir() else None
    if resume:
        handle.count_resume(db)
        log.info("training run %s resumes from %s", handle.run_id, resume)
    final = output_dir / FINAL
    reached = _checkpoint_step(resume) if resume else 0
    if resume and plan.max_steps > 0 and reached >= plan.max_steps:
        # Killed after its last checkpoint: that checkpoint is the final model (transformers,
        # resumed, would train one step past the plan).  No trainer is built, so the ranks of
        # a launch meet in no collective here.
        log.info("training run %s: %s already holds all %s steps", handle.run_id, resume, plan.max_steps)
        if handle.owns_row:
            _checkpoint_as_final(Path(resume), final)
            _write_side_files(plan, handle, output_dir, final)
        return resume, reached
    if handle.owns_row:
        _write_side_files(plan, handle, output_dir)
    recorder = make_recorder(
        db, handle.run_id, handle.owner, handle.ttl, plan.accuracy or ClassAccuracy(), options.on_step
    )
    trainer = plan.trainer(**plan.arguments, callbacks=[recorder])
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(str(final))  # every rank calls it (ZeRO-3 gathers); the main one writes
    if handle.owns_row:
        if getattr(trainer, "processing_class", None) is not None:
            trainer.processing_class.save_pretrained(str(final))
        _write_side_files(plan, handle, final)
    return resume, int(trainer.state.global_step)


def _write_side_files(plan: RunPlan, handle: RunHandle, *folders: Path) -> None:
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        for name, document in plan.side_files.items():
            stamped = {**document, "source": f"training run {handle.run_id}"}
            (folder / name).write_text(json.dumps(stamped, indent=2) + "\n", encoding="utf-8")


def _last_checkpoint(trainer: Any, output_dir: Path) -> str | None:
    own = getattr(trainer, "last_checkpoint", None)
    if own is not None:
        found = own(output_dir)
        return str(found) if found else None
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(output_dir))


_TRAINING_STATE = ("optimizer", "scheduler", "rng_state", "trainer_state", "training_args", "global_step")


def _checkpoint_as_final(checkpoint: Path, final: Path) -> None:
    """The model files of a complete checkpoint (weights, config, tokenizer) as ``final``."""
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(checkpoint, partial, ignore=lambda _dir, names: [n for n in names if n.startswith(_TRAINING_STATE)])
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)


def _checkpoint_step(checkpoint: str) -> int:
    """The step a checkpoint holds: its folder's number (``checkpoint-N``), which every
    trainer here names it by."""
    tail = Path(checkpoint).name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _claim(db: Database, handle: RunHandle, wait_s: float) -> None:
    assert handle.run_id is not None  # only the main rank claims
    deadline = time.monotonic() + wait_s
    while True:
        with db.session() as session:
            if queries.claim_run(session, handle.run_id, handle.owner, handle.ttl, socket.gethostname()):
                return
            holder = queries.get_run(session, handle.run_id)
        if time.monotonic() >= deadline:
            raise TrainingBusy(
                f"training run {handle.run_id} is being trained by {holder.lease_owner}; try again later"
            )
        time.sleep(min(2.0, max(0.2, handle.ttl / 10)))
