"""The long-running trainer service: waits for labelled data, snapshots it, trains.

One service per lineage at a time (a database lease, ``trainer:<lineage>``); a second one
waits for it.  Each cycle it first resumes an unfinished run of its lineage (a crash or a
kill left it), then, when at least ``min_new_chunks`` chunks were labelled since the
lineage's latest snapshot, makes a snapshot and trains on it, starting from the lineage's
latest trained model (the recipe's base model for the first).  Then every set whose
priority strategy follows the lineage (``--priority uncertainty:lineage=NAME``) gets a new
priority round: its waiting trajectories are re-scored by the new judge (queue work) and
re-ordered, and the round records which run ordered them and what the set had spent.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.models.training import RUN_DONE
from stepq.trainer import methods
from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
from stepq.trainer.training.launch import train_command
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.records import process_owner
from stepq.trainer.training.runs import FINAL, TrainOptions
from stepq.workers.labelling.labels import parse_rule
from stepq.workers.priority.rounds import follow_lineage

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
    until_first_error: bool = False
    """Snapshots keep each trajectory's chunks only up to its first error (``SnapshotSpec``)."""
    balance_by_position: bool = False
    """Snapshots balance each step position on its own (``SnapshotSpec``)."""
    poll_s: float = 30.0
    lease_ttl_s: float = 120.0
    max_trainings: int | None = None
    """Exit after this many trainings (tests, one-shot jobs); None: run forever."""
    max_idle_s: float | None = None
    """Exit after this long without anything to train; None: wait forever."""
    processes: int = 1
    """Training processes (GPUs) per run: above 1, each training is a ``torchrun`` launch of
    ``stepq train`` (DDP, or DeepSpeed through the recipe), watched by the service."""


def serve(db: Database, options: ServiceOptions, say: Callable[[str], None] = log.info) -> int:
    """Run until stopped (or the limits in ``options``); returns how many trainings ran."""
    recipe = Recipe.load(options.recipe)
    method = methods.method_named(recipe.method)
    if not method.trains_on_snapshots:
        trainable = ", ".join(n for n, m in methods.REGISTRY.items() if m.trains_on_snapshots)
        raise ConfigError(
            f"the service trains a lineage on its snapshots, and the recipe's method '{method.name}' does not "
            f"train on a snapshot (one that does: {trainable})"
        )
    if options.processes > 1 and method.one_process:
        raise ConfigError(f"method '{method.name}' trains in one process: run the service without --processes")
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
    waiting: str | None = None
    try:
        while options.max_trainings is None or trainings < options.max_trainings:
            renew()
            why = _step(db, options, recipe, rule, renew, say)
            if why is None:
                trainings += 1
                idle_since = time.monotonic()
                waiting = None
                continue
            if why != waiting:  # once per change, not every poll
                say(why)
                waiting = why
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
) -> str | None:
    """Resume or start one training; None when one ran, else why there was nothing to do."""
    with db.session() as session:
        runs = queries.lineage_runs(session, options.lineage)
    unfinished = [r for r in runs if r.status != RUN_DONE]
    if unfinished:
        run = unfinished[0]
        say(f"resuming training run {run.id} (snapshot {run.snapshot_id}) from {run.last_checkpoint or 'its start'}")
        assert run.snapshot_id is not None  # a lineage trains on its snapshots
        if _train(db, options, recipe, run.snapshot_id, Path(run.output_dir), run.base_model, renew, say):
            _reprioritise(db, options.lineage, say)
            return None
        return f"training run {run.id} did not finish; the next cycle resumes it"
    with db.session() as session:
        set_ids = queries.set_ids_by_name(session, list(options.sets))
        labelled = queries.count_labelled(session, set_ids, rule)
        latest = queries.latest_snapshot(session, options.lineage)
        number = queries.next_snapshot_number(session)
        by_rule = queries.rules_labelled(session, set_ids) if labelled == 0 else {}
    seen = int(latest.manifest.get("labelled_chunks_seen", 0)) if latest else 0
    # a lineage keeps the split key it began with, so no problem changes sides between its
    # snapshots (those made before external ids keyed the split have none in their manifest)
    split_by = str(latest.manifest.get("split_by", "row-id")) if latest else "external-id"
    if labelled - seen < options.min_new_chunks:
        return _waiting_for(options, rule, latest.name if latest else None, by_rule)
    name = f"{options.lineage}-{number}"
    snapshot = create_snapshot(
        db,
        SnapshotSpec(
            options.sets,
            rule,
            options.val_fraction,
            options.seed,
            True,
            name=name,
            lineage=options.lineage,
            split_by=split_by,
            until_first_error=options.until_first_error,
            balance_by_position=options.balance_by_position,
        ),
    )
    done = [r for r in runs if r.status == RUN_DONE]
    base = str(Path(done[-1].output_dir) / FINAL) if done else recipe.model
    say(f"snapshot {snapshot} ({labelled - seen} new labelled chunks); training from {base}")
    if _train(db, options, recipe, snapshot, options.output_root / name, base, renew, say):
        _reprioritise(db, options.lineage, say)
        return None
    return f"the training on snapshot {snapshot} did not finish; the next cycle resumes it"


def _waiting_for(options: ServiceOptions, rule: str, latest: str | None, by_rule: dict[str, list[str]]) -> str:
    """Why the lineage trains nothing yet, in words an operator can act on: above all a rule
    its sets hold no labels under while they hold labels under another."""
    lineage = f"lineage '{options.lineage}' (rule {rule})"
    if by_rule:
        others = "; ".join(f"{other}: {', '.join(names)}" for other, names in by_rule.items())
        return f"{lineage}: no chunk of its sets is labelled under this rule; sets labelled {others}"
    since = f"since snapshot {latest}" if latest else "for its first snapshot"
    return f"{lineage}: waiting for {options.min_new_chunks} new labelled chunks {since}"


def _reprioritise(db: Database, lineage: str, say: Callable[[str], None]) -> None:
    """The lineage has a new judge: every set ordered by it gets a new priority round (its
    waiting trajectories re-scored by queue work), recorded with the run that ordered it."""
    with db.session() as session:
        for report in follow_lineage(session, lineage):
            say(
                f"priority round {report.round_id} ({report.strategy}): {report.scoring_jobs} scoring jobs "
                f"for the judge of training run {report.judge_run_id}"
            )


def _train(
    db: Database,
    options: ServiceOptions,
    recipe: Recipe,
    snapshot: int,
    output_dir: Path,
    base: str,
    renew: Callable[[], None],
    say: Callable[[str], None],
) -> bool:
    """One training of the lineage, in this process or as a multi-process launch; False
    when a launch failed (a rank died): its run stays unfinished, and the next cycle
    resumes it from its last checkpoint rather than starting a second run."""
    wait_s = 2 * options.lease_ttl_s
    if options.processes == 1:
        train_options = TrainOptions(
            lease_ttl_s=options.lease_ttl_s, wait_s=wait_s, lineage=options.lineage, base_model=base, on_step=renew
        )
        result = methods.train(
            db, recipe.method, recipe, methods.TrainingData(snapshot=str(snapshot)), output_dir, train_options
        )
        say(f"training run {result.run_id} done at step {result.global_step}: {result.final_model}")
        return True
    args = ["--snapshot", str(snapshot), "--recipe", options.recipe, "--model", base]
    args += ["--output", str(output_dir), "--lineage", options.lineage, "--wait", str(wait_s)]
    command = train_command(options.processes, args)
    say(f"launching {options.processes} training processes: {shlex.join(command)}")
    process = subprocess.Popen(command)
    try:
        while process.poll() is None:
            renew()
            time.sleep(min(5.0, options.lease_ttl_s / 4))
    finally:
        if process.poll() is None:  # the service is stopping: take the launch down with it
            process.terminate()
            process.wait()
    if process.returncode != 0:
        say(f"the training launch exited with code {process.returncode}; the next cycle resumes its run")
        return False
    say(f"training on snapshot {snapshot} done: {output_dir / FINAL}")
    return True
