"""The embedded default: the dispatcher and the task code run in this process.

No broker and no worker processes; the dispatcher publishes into a local list and the
same ``run_work_item`` a Celery worker runs drains it.  Used by ``stepq run`` and tests.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

from stepq.models import Database, epoch, queries
from stepq.workers.annotate import WorkerRuntime, run_work_items
from stepq.workers.dispatcher import Dispatcher, DispatchOptions


def run_in_process(
    db: Database,
    runtime: WorkerRuntime,
    *,
    on_item: Callable[[int, str], None] | None = None,
    options: DispatchOptions | None = None,
    items_per_task: int = 1,
) -> dict[str, int]:
    """Run every pending work item to the end; returns outcome counts."""
    inbox: deque[int] = deque()

    def publish(ids: Sequence[int]) -> None:
        inbox.extend(ids)

    # No broker to keep bounded: each cycle hands over everything pending.
    unbounded = replace(options or DispatchOptions(), messages_per_worker=None)
    dispatcher = Dispatcher(
        db, publish, options=unbounded, queue_depth=lambda: len(inbox), name=f"embedded:{runtime.name}"
    )
    outcomes: dict[str, int] = {}
    if not dispatcher.acquire():
        from stepq.models.errors import Busy

        raise Busy("another dispatcher is running against this database; stop it first")
    try:
        while True:  # each cycle publishes what is pending (retries included); none left: done
            dispatcher.cycle()
            if not inbox:
                with db.session() as s:
                    wake = queries.next_retry_at(s)
                if wake is None:
                    break
                time.sleep(min(max(0.0, wake - epoch()), 60.0))  # a retry is backing off
                continue
            while inbox:
                ids = [inbox.popleft() for _ in range(min(items_per_task, len(inbox)))]
                for work_id, outcome in run_work_items(runtime, ids).items():
                    outcomes[outcome.status] = outcomes.get(outcome.status, 0) + 1
                    if on_item:
                        on_item(work_id, outcome.status)
                dispatcher.acquire()  # renew the lock between items
    finally:
        dispatcher.release()
    return outcomes
