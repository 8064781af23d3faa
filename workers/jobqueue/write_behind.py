"""Commit a task's last batches on a background thread while the worker's next task generates.

A worker spends most of its time in ``generate``; grading and committing a batch (a
transaction per trajectory: rollouts, Q-values, labels, "done") is CPU and database time on
which the engine waits.  Measured through the queue (``bench_queue``), it was about 4% of a
worker's time.  When a batch is a trajectory's last for sure (its budget asks once, and this
batch serves every request), nothing in the task waits on its outcome, so the task hands it
to this thread and returns; the next message's engine call starts at once.

Nothing is lost by it: the job stays held (its lease renewed by the heartbeat) until its
batch is committed with "done", so a killed worker's uncommitted batch goes back with the
lease like any claimed job's; a stopping worker drains the thread before its heartbeat stops.
At most ``max_pending`` batches (8) wait at a time: a slow database slows the worker down
instead of piling up memory.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from stepq.workers.jobqueue.held_jobs import HeldJobs
from stepq.workers.jobqueue.job_kind import JobKind

log = logging.getLogger("stepq.worker")


@dataclass(frozen=True)
class _Write:
    kind: JobKind
    job_id: int
    commit: Callable[[], None]
    """Commits the batch and settles the job, handling its own errors (a lost lease, a failure)."""


class WriteBehind:
    """One thread, first in first out, holding each job until its batch is committed."""

    def __init__(self, held: HeldJobs, max_pending: int = 8) -> None:
        self.held = held
        self._queue: queue.Queue[_Write | None] = queue.Queue(maxsize=max_pending)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, kind: JobKind, job_id: int, commit: Callable[[], None]) -> None:
        """Queue a commit (blocking while ``max_pending`` wait); the job is held from now on."""
        self.held.hold(kind, [job_id])
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="stepq-write-behind", daemon=True)
                self._thread.start()
        self._queue.put(_Write(kind, job_id, commit))

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                try:
                    item.commit()
                except BaseException as exc:  # commit settles its own errors; this is a last resort
                    what = f"{item.kind.table.name} job {item.job_id}"
                    log.error("write-behind of %s failed: %s (its lease will expire)", what, exc)
                finally:
                    self.held.release(item.kind, [item.job_id])
            finally:
                self._queue.task_done()

    def drain(self) -> None:
        """Wait until every submitted batch is committed (or settled as failed)."""
        self._queue.join()

    def close(self) -> None:
        """Drain, then stop the thread; submitting afterwards starts a new one."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(None)
        thread.join()
