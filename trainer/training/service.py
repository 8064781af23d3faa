"""The long-running trainer service: waits for labelled data, snapshots it, trains.

One service per lineage at a time (a database lease, ``trainer:<lineage>``); a second one
waits for it.  Each cycle it first resumes an unfinished run of its lineage (a crash or a
kill left it), then, when at least ``min_new_chunks`` chunks were labelled since the
lineage's latest snapshot, makes a snapshot and trains on it, starting from the lineage's
latest trained model (the recipe's base model for the first).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from stepq.models import Database, queries
from stepq.models import training_queries as tq
from stepq.models.training import RUN_DONE
from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
from stepq.trainer.training.grpo import FINAL, TrainOptions, train_judge
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.records import process_owner
from stepq.workers.labels import parse_rule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceOptions:
    lineage: str
    recipe: str
    output_root: Path
    sets: tuple[str, ...]
    rule: str = "abs-q"
    min_new_chunks: int = 1000
    val_fraction: float = 0.1
    seed: int = 0
    poll_s: float = 30.0
    lease_ttl_s: float = 120.0
    max_trainings: int | None = None
    """Exit after this many trainings (tests, one-shot jobs); None: run forever."""
    max_idle_s: float | None = None
    """Exit after this long without anything to train; None: wait forever."""


def serve(db: Database, options: ServiceOptions, say: Callable[[str], None] = log.info) -> int:
    """Run until stopped (or the limits in ``options``); returns how many trainings ran."""
    recipe = Recipe.load(options.recipe)
    rule = parse_rule(options.rule).key
    owner = process_owner()
    lock = f"trainer:{options.lineage}"
    waited = False
    while True:
        with db.session() as session:
            if queries.acquire_lock(session, lock, owner, options.lease_ttl_s):
                break
        if not waited:
            say(f"another trainer serves lineage '{options.lineage}'; waiting for its lease")
            waited = True
        time.sleep(min(options.poll_s, max(0.5, options.lease_ttl_s / 5)))

    def renew() -> None:
        with db.session() as session:
            queries.acquire_lock(session, lock, owner, options.lease_ttl_s)

    trainings = 0
    idle_since = time.monotonic()
    try:
        while options.max_trainings is None or trainings < options.max_trainings:
            renew()
            if _step(db, options, recipe, rule, renew, say):
                trainings += 1
                idle_since = time.monotonic()
                continue
            if options.max_idle_s is not None and time.monotonic() - idle_since > options.max_idle_s:
                say("nothing to train; exiting (idle limit)")
                break
            time.sleep(options.poll_s)
    finally:
        with db.session() as session:
            queries.release_lock(session, lock, owner)
    return trainings


def _step(
    db: Database,
    options: ServiceOptions,
    recipe: Recipe,
    rule: str,
    renew: Callable[[], None],
    say: Callable[[str], None],
) -> bool:
    """Resume or start one training; False when there is nothing to do yet."""
    train_options = TrainOptions(
        lease_ttl_s=options.lease_ttl_s, wait_s=2 * options.lease_ttl_s, lineage=options.lineage
    )
    with db.session() as session:
        runs = tq.lineage_runs(session, options.lineage)
    unfinished = [r for r in runs if r.status != RUN_DONE]
    if unfinished:
        run = unfinished[0]
        say(f"resuming training run {run.id} (snapshot {run.snapshot_id}) from {run.last_checkpoint or 'its start'}")
        opts = replace(train_options, base_model=run.base_model)
        assert run.snapshot_id is not None  # a lineage trains GRPO judges on snapshots
        result = train_judge(db, run.snapshot_id, recipe, Path(run.output_dir), opts, on_step=renew)
        say(f"training run {result.run_id} done at step {result.global_step}: {result.final_model}")
        return True
    with db.session() as session:
        set_ids = tq.set_ids_by_name(session, list(options.sets))
        labelled = tq.count_labelled(session, set_ids, rule)
        latest = tq.latest_snapshot(session, options.lineage)
        number = tq.next_snapshot_number(session)
    seen = int(latest.manifest.get("labelled_chunks_seen", 0)) if latest else 0
    if labelled - seen < options.min_new_chunks:
        return False
    name = f"{options.lineage}-{number}"
    snapshot = create_snapshot(
        db,
        SnapshotSpec(options.sets, rule, options.val_fraction, options.seed, True, name=name, lineage=options.lineage),
    )
    done = [r for r in runs if r.status == RUN_DONE]
    base = str(Path(done[-1].output_dir) / FINAL) if done else recipe.model
    say(f"snapshot {snapshot} ({labelled - seen} new labelled chunks); training from {base}")
    opts = replace(train_options, base_model=base)
    result = train_judge(db, snapshot, recipe, options.output_root / name, opts, on_step=renew)
    say(f"training run {result.run_id} done at step {result.global_step}: {result.final_model}")
    return True
