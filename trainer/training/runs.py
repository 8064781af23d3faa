"""The life of a recorded training run, the same for every method (GRPO, DPO, PRM).

A run is identified by its output directory: starting the same training again (after a
crash, a kill, a pre-empted node) takes over the same run row and resumes from the last
checkpoint in that directory.  One process at a time holds the run's lease; a second one
waits up to ``wait_s`` and then fails with ``TrainingBusy``.  Whatever the method, the body
gets the run's id and lease owner and returns the final global step.
"""

from __future__ import annotations

import logging
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class TrainResult:
    run_id: int
    status: str
    resumed_from: str | None
    final_model: Path
    global_step: int


@dataclass(frozen=True)
class RunSpec:
    """What a run trains on and how: exactly one of ``snapshot_id`` and ``dataset``."""

    method: str
    recipe_text: str
    base_model: str
    output_dir: Path
    snapshot_id: int | None = None
    dataset: str | None = None


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

    def renew(self, db: Database, **values: Any) -> bool:
        if self.run_id is None:
            return True
        with db.session() as session:
            return queries.renew_run(session, self.run_id, self.owner, self.ttl, **values)


Body = Callable[[RunHandle], tuple[str | None, int]]
"""Trains; returns (the checkpoint it resumed from or None, the final global step)."""


def recorded_run(db: Database, spec: RunSpec, options: TrainOptions, body: Body) -> TrainResult:
    """Create or take over the run writing to ``spec.output_dir``, run ``body`` under its
    lease, and record how it ended (a failure keeps its error on the row).

    Under a multi-process launch only rank 0 does this; the other ranks run ``body`` as
    followers (see ``ranks``), after the same "already done" check.
    """
    output_dir = spec.output_dir.resolve()
    check_base_model(spec.base_model)
    if not current_rank().is_main:
        return _follow(db, spec, body)
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
        resumed, step = body(handle)
    except BaseException as exc:
        if not isinstance(exc, KeyboardInterrupt | SystemExit):
            with db.session() as session:
                queries.end_run(session, run_id, handle.owner, error=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    handle.renew(db, global_step=step)
    with db.session() as session:
        queries.end_run(session, run_id, handle.owner)
    return TrainResult(run_id, RUN_DONE, resumed, output_dir / FINAL, step)


def _follow(db: Database, spec: RunSpec, body: Body) -> TrainResult:
    """A non-main rank: train beside rank 0 and write nothing.  A finished run is done for
    every rank (rank 0 returns without training, so the others must too)."""
    output_dir = spec.output_dir.resolve()
    with db.session() as session:
        existing = queries.run_by_output(session, str(output_dir))
    if existing is not None and existing.status == RUN_DONE and existing.method == spec.method:
        return TrainResult(existing.id, RUN_DONE, None, output_dir / FINAL, existing.global_step)
    resumed, step = body(RunHandle(None, process_owner(), 0.0))
    with db.session() as session:
        row = queries.run_by_output(session, str(output_dir))
    return TrainResult(row.id if row else 0, RUN_DONE, resumed, output_dir / FINAL, step)


def recorded_trl_run(
    db: Database,
    spec: RunSpec,
    options: TrainOptions,
    build: Callable[[Any], Any],
    *,
    prepare: Callable[[RunHandle], None] | None = None,
    accuracy: ClassAccuracy | None = None,
    on_step: Callable[[], None] | None = None,
    max_steps: int = 0,
) -> TrainResult:
    """A recorded run of a TRL trainer, the whole lifecycle in one call: the run row and its
    lease (``recorded_run``), then ``prepare(handle)`` (what the method writes beside the
    model), then the trainer ``build(recorder)`` makes, resumed from the last checkpoint
    (``run_trl``).  A method describes its run; it is not called back into."""

    def body(handle: RunHandle) -> tuple[str | None, int]:
        if prepare is not None:
            prepare(handle)
        return run_trl(db, handle, spec.output_dir.resolve(), build, accuracy, on_step, max_steps=max_steps)

    return recorded_run(db, spec, options, body)


def run_trl(
    db: Database,
    handle: RunHandle,
    output_dir: Path,
    build: Callable[[Any], Any],
    accuracy: ClassAccuracy | None = None,
    on_step: Callable[[], None] | None = None,
    *,
    max_steps: int = 0,
) -> tuple[str | None, int]:
    """The body of a TRL run: resume from the last checkpoint in ``output_dir`` if any, train
    the trainer ``build(recorder)`` makes (its callbacks must include the recorder), save the
    final model and its tokenizer to ``OUTPUT/final``.  ``max_steps``: the config's plan."""
    from transformers.trainer_utils import get_last_checkpoint

    resume = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
    if resume:
        handle.count_resume(db)
        log.info("training run %s resumes from %s", handle.run_id, resume)
    reached = _checkpoint_step(resume) if resume else 0
    if resume and max_steps > 0 and reached >= max_steps:
        # Killed after its last checkpoint: that checkpoint is the final model (transformers,
        # resumed, would train one step past the plan).  No trainer is built, so the ranks of
        # a launch meet in no collective here.
        log.info("training run %s: %s already holds all %s steps", handle.run_id, resume, max_steps)
        if handle.owns_row:
            _checkpoint_as_final(Path(resume), output_dir / FINAL)
        return resume, reached
    recorder = make_recorder(db, handle.run_id, handle.owner, handle.ttl, accuracy or ClassAccuracy(), on_step)
    trainer = build(recorder)
    trainer.train(resume_from_checkpoint=resume)
    final = output_dir / FINAL
    trainer.save_model(str(final))  # every rank calls it (ZeRO-3 gathers); the main one writes
    if trainer.processing_class is not None and handle.owns_row:
        trainer.processing_class.save_pretrained(str(final))
    return resume, int(trainer.state.global_step)


_TRAINING_STATE = ("optimizer", "scheduler", "rng_state", "trainer_state", "training_args", "global_step")


def _checkpoint_as_final(checkpoint: Path, final: Path) -> None:
    """The model files of a complete checkpoint (weights, config, tokenizer) as ``final``."""
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(checkpoint, partial, ignore=lambda _dir, names: [n for n in names if n.startswith(_TRAINING_STATE)])
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)


def _checkpoint_step(checkpoint: str) -> int:
    import json

    try:
        state = json.loads((Path(checkpoint) / "trainer_state.json").read_text(encoding="utf-8"))
        return int(state.get("global_step", 0))
    except (OSError, ValueError):
        return 0


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
