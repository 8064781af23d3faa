"""``stepq run``: migrate, create a demo set if needed, annotate in-process, summarise."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from stepq.assembly import configured_runtime, kinds_of, worker_runtime
from stepq.migrations import upgrade
from stepq.models import Database, jobs, queries
from stepq.models.errors import Busy, ConfigError, Interrupted, NotFoundError, WorkFailed
from stepq.models.work import ROLLOUT_WORK
from stepq.settings import Settings
from stepq.status import collect, render
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import EMBEDDED_HOLDER, run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.labelling.rollout_handler import ROLLOUTS
from stepq.workers.priority.scoring_handler import SCORINGS

DEFAULT_M = 8


class WarmStop:
    """Ctrl-C while a run annotates: the first press asks for a warm stop (the batch in hand
    finishes, the rest goes back to pending, exit 130); the second stops at once (what is in
    hand goes back unharmed).  Neither spends an attempt.  A no-op off the main thread."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self._echo, self._asked = echo, False
        self._previous: Any = None

    def requested(self) -> bool:
        return self._asked

    def _on_sigint(self, signum: int, frame: object) -> None:
        if self._asked:
            raise KeyboardInterrupt
        self._asked = True
        self._echo("stopping after the batch in hand (Ctrl-C again to stop now)")

    def __enter__(self) -> WarmStop:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def keep_settings(
    set_name: str, stored: tuple[int, str | None, str | None], m: int | None, rule: str | None, budget: str | None
) -> int:
    """The M to run with: the set's own once it has one.  A flag that would change a set's
    stored M, rule or budget is refused, naming the command that changes it on purpose: the
    obvious resume (``stepq run --set S``) must never relabel a set silently."""
    from stepq.workers.labelling.budget import parse_budget
    from stepq.workers.labelling.labels import parse_rule

    stored_m, stored_rule, stored_budget = stored
    changes = []
    if m is not None and stored_m and m != stored_m:
        changes.append(f"M={stored_m}")
    if rule is not None and stored_rule and parse_rule(rule).key != stored_rule:
        changes.append(f"rule {stored_rule}")
    if budget is not None and stored_budget and parse_budget(budget).pinned != stored_budget:
        changes.append(f"budget {stored_budget}")
    if changes:
        on_purpose = f"stepq annotate --set {set_name} --rollouts {m or stored_m}"
        on_purpose += f" --rule {rule}" if rule is not None else ""
        on_purpose += f" --budget {budget}" if budget is not None else ""
        raise ConfigError(
            f"set '{set_name}' is annotated with {', '.join(changes)}; 'stepq run' keeps a set's settings "
            f"(run it without those flags to resume).  To change them on purpose: {on_purpose}"
        )
    return m or stored_m or DEFAULT_M


def annotate_in_process(
    db: Database, set_name: str, m: int, *, worker: str = "embedded", batch_rollouts: int = 256, **plan: Any
) -> dict[str, int]:
    """Plan the set's annotation at M (``plan``: ``configure_annotation``'s options: rule,
    budget, backend, ...) and run all of it here, as ``stepq run`` does, without the command's
    progress and summary: the library call scripts, benchmarks and tests annotate through.
    Returns the outcome counts."""
    configure_annotation(db, set_name, m, **plan)
    runtime = worker_runtime(db, WorkerOptions(name=worker, batch_rollouts=batch_rollouts))
    try:
        return run_in_process(db, runtime)
    finally:
        runtime.close()  # its warm backends and judges


DEMO_SET = "demo"
DEMO_PROBLEMS = 50
"""The quick start's set: the bare ``stepq run`` makes it; any other set must exist, or be asked
for with ``--synthetic N``."""


def run_embedded(
    settings: Settings,
    set_name: str,
    *,
    n_synth: int | None,
    m: int | None,
    seed: int,
    echo: Callable[[str], None],
    rule: str | None = None,
    budget: str | None = None,
) -> None:
    upgrade(settings.database_url)
    db = Database(settings.database_url, guards=settings.session_guards())
    with db.session() as s:
        holder = queries.lock_holder(s, "dispatcher")
    if holder is not None and holder.startswith(EMBEDDED_HOLDER):  # before anything is created or planned
        raise Busy(
            f"another 'stepq run' ({holder[len(EMBEDDED_HOLDER) :]}) is working on {db.safe_url}: wait for it to "
            "finish (or stop it with Ctrl-C), then run again; nothing was created"
        )
    if holder is not None:
        raise Busy(
            f"a dispatcher ({holder}) is running against {db.safe_url}: stop it first, or let it do the work "
            "('stepq annotate' plans, the dispatcher publishes)"
        )
    stored: tuple[int, str | None, str | None]
    with db.session() as s:
        try:
            pset = queries.get_set(s, set_name)
            stored = (pset.rollouts_per_prefix, pset.label_rule, pset.budget_policy)
            exists = True
        except NotFoundError:
            stored, exists = (0, None, None), False
    m = keep_settings(set_name, stored, m, rule, budget)
    if not exists:
        if n_synth is None and set_name != DEMO_SET:  # a typo must not become a new set
            with db.session() as s:
                raise queries.no_such_set(s, set_name)
        if n_synth == 0:
            raise NotFoundError(f"no problem set '{set_name}' and --synthetic 0")
        n_synth = DEMO_PROBLEMS if n_synth is None else n_synth
        report = synth_set(db, set_name, problems=n_synth, seed=seed)
        echo(f"created synthetic set '{set_name}': {report.new_problems} problems")
    configure_annotation(db, set_name, m, rule=rule, budget=budget)
    with db.session() as s:
        total = len(queries.set_trajectory_ids(s, queries.get_set(s, set_name).id))
    with db.session() as s:
        set_id = queries.get_set(s, set_name).id
        drawn_before = _drawn(s, set_id)
    started = time.monotonic()
    runtime = configured_runtime(settings, db, "embedded")
    stop = WarmStop(echo)
    with (
        stop,
        Progress(
            TextColumn("annotating {task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()
        ) as bar,
    ):
        task = bar.add_task(set_name, total=total)
        try:
            outcomes = run_in_process(
                db,
                runtime,
                kinds=kinds_of(settings, [ROLLOUTS, SCORINGS]),
                on_item=lambda _id, _st: bar.advance(task),
                options=settings.dispatch_options(),
                items_per_task=settings.items_per_task,
                stop=stop.requested,
            )
        finally:
            runtime.close()
    if stop.requested():
        raise Interrupted(
            f"stopped: {sum(outcomes.values())} work items settled this run ({outcomes}); the rest of set "
            f"'{set_name}' is pending, no attempt spent: 'stepq run --set {set_name}' resumes"
        )
    echo(f"work items: {outcomes}")
    with db.session() as s:  # this run's own rate: the fleet's progress samples are a dispatcher's
        rate = (_drawn(s, set_id) - drawn_before) / max(1e-9, time.monotonic() - started)
    echo(render(collect(db, rates={set_id: round(rate, 2)})))
    with db.session() as s:
        pset = queries.get_set(s, set_name)
        rows = queries.labels_with_truth(s, pset.id, pset.label_rule)
    if rows:
        agree = sum(p == g for p, g in rows) / len(rows)
        echo(
            f"{pset.label_rule} labels agree with the synthetic step-level ground truth "
            f"on {100 * agree:.1f}% of {len(rows)} chunks"
        )
    echo(f"database: {db.safe_url}  (query the views: annotation_progress, chunk_q_values, work_queue)")
    with db.session() as s:
        failed, last_error = jobs.failed_in_set(s, ROLLOUT_WORK, queries.get_set(s, set_name).id)
    if failed:  # the labels are incomplete: a script must not take this run for a success
        raise WorkFailed(
            f"{failed} work items of set '{set_name}' failed (latest: {last_error}); see 'stepq status', and "
            f"'stepq retry --set {set_name}' once the cause is fixed"
        )


def _drawn(session: Any, set_id: int) -> int:
    return next((int(r["rollouts_done"]) for r in queries.progress(session) if r["problem_set_id"] == set_id), 0)
