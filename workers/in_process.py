"""The embedded default: the dispatcher and the task code run in this process.

No broker and no worker processes; the dispatcher publishes into a local list and the same
handlers a Celery worker runs drain it.  Used by ``stepq run`` (rollouts, and the priority
scorings that order them), ``stepq search run`` (step searches), tests and benchmarks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

from stepq.models import Database, epoch, jobs
from stepq.workers.jobqueue.dispatcher import Dispatcher, DispatchOptions
from stepq.workers.jobqueue.job_kind import JobKind
from stepq.workers.jobqueue.runner import run_jobs
from stepq.workers.jobqueue.runtime import WorkerRuntime
from stepq.workers.kinds import outlets
from stepq.workers.labelling.rollout_handler import ROLLOUTS
from stepq.workers.priority.scoring_handler import SCORINGS
from stepq.workers.search.search_handler import SEARCHES

EMBEDDED_HOLDER = "embedded:"
"""How the dispatcher lock names a process running the queue in process (``stepq run``)."""


def run_in_process(
    db: Database,
    runtime: WorkerRuntime,
    *,
    kinds: Sequence[JobKind] = (ROLLOUTS, SCORINGS),
    on_item: Callable[[int, str], None] | None = None,
    on_kind: JobKind = ROLLOUTS,
    options: DispatchOptions | None = None,
    items_per_task: int = 1,
    stop: Callable[[], bool] | None = None,
) -> dict[str, int]:
    """Run every pending job of these kinds to the end, or until ``stop()`` says so between
    messages (what was published and not run goes back to pending); returns outcome counts.
    ``on_item(id, status)`` hears of each job of ``on_kind`` (a progress bar's unit)."""
    inbox: deque[tuple[JobKind, list[int]]] = deque()

    def publisher(kind: JobKind, per: int) -> Callable[[Sequence[int]], None]:
        def publish(ids: Sequence[int]) -> None:
            inbox.extend((kind, list(ids[i : i + per])) for i in range(0, len(ids), per))

        return publish

    # No broker to keep bounded: each cycle hands over everything pending.
    unbounded = replace(options or DispatchOptions(), messages_per_worker=None)
    dispatcher = Dispatcher(
        db,
        outlets(publisher, items_per_task, kinds),
        options=unbounded,
        queue_depth=lambda: len(inbox),
        name=f"{EMBEDDED_HOLDER}{runtime.name}",
    )
    outcomes: dict[str, int] = {}
    if not dispatcher.acquire():
        from stepq.models.errors import Busy

        raise Busy(f"another dispatcher ({dispatcher.holder()}) is running against this database; stop it first")
    try:
        while True:  # each cycle publishes what is pending (retries included); none left: done
            dispatcher.cycle()
            if not inbox:
                with db.session() as s:
                    wakes = [w for kind in kinds if (w := jobs.next_retry_at(s, kind.table)) is not None]
                if not wakes:
                    break
                time.sleep(min(max(0.0, min(wakes) - epoch()), 60.0))  # a retry is backing off
                continue
            while inbox:
                if (stop is not None and stop()) or not runtime.health.healthy:
                    return outcomes  # an unhealthy runtime claims nothing: do not spin on it
                kind, ids = inbox[0]  # left in the inbox while it runs: an interrupt puts it back
                done = run_jobs(runtime, kind, ids)
                inbox.popleft()
                for job_id, status in done.items():
                    outcomes[status] = outcomes.get(status, 0) + 1
                    if on_item and kind.table is on_kind.table:
                        on_item(job_id, status)
                dispatcher.acquire()  # renew the lock between tasks
    finally:
        pressed = _put_back(db, inbox)  # stopped, interrupted or failed: what was not run is pending again
        dispatcher.release()
        if pressed:
            raise KeyboardInterrupt
    return outcomes


def _put_back(db: Database, inbox: deque[tuple[JobKind, list[int]]]) -> bool:
    """Published and not run -> pending.  A Ctrl-C arriving meanwhile (an operator's second
    press lands here as often as not) does not cut it short; returns whether one came."""
    pressed = False
    while inbox:
        try:
            with db.session() as s:
                for kind, ids in inbox:
                    jobs.unmark_queued(s, kind.table, ids)
            inbox.clear()
        except KeyboardInterrupt:
            pressed = True
    return pressed


def run_searches_here(db: Database, runtime: WorkerRuntime, kind: JobKind = SEARCHES) -> dict[str, int]:
    """Run every pending step search in this process (no broker); returns outcome counts."""
    return run_in_process(db, runtime, kinds=[kind])
