"""Whether a worker process is fit to take work: a backend that cannot generate (a model that
will not load, a server gone for good) fails every job it is handed, each an attempt spent, on
every set, while looking alive.  After ``threshold`` jobs in a row failed with errors of their
own kind (transient: a permanent error is the job's fault, not the worker's), the process
calls itself unhealthy: it stops taking work and says why, in ``stepq status`` and the
metrics, until it is restarted.  Any job done resets the count."""

from __future__ import annotations

import logging
import threading

from stepq.workers.jobqueue.job_kind import is_permanent

log = logging.getLogger("stepq.worker")


class Health:
    def __init__(self, threshold: int) -> None:
        """``threshold``: failed jobs in a row that make the process unhealthy (0: never)."""
        self.threshold = threshold
        self.reason: str | None = None
        self._in_a_row = 0
        self._lock = threading.Lock()

    def done(self) -> None:
        with self._lock:
            self._in_a_row = 0

    def failed(self, exc: BaseException) -> None:
        if is_permanent(exc) or isinstance(exc, KeyboardInterrupt):
            return
        with self._lock:
            self._in_a_row += 1
            if self.reason is None and self.threshold and self._in_a_row >= self.threshold:
                self.reason = f"{self._in_a_row} jobs in a row failed; the last: {type(exc).__name__}: {exc}"[:1000]
                log.error("this worker is unhealthy and takes no more work: %s", self.reason)

    @property
    def healthy(self) -> bool:
        return self.reason is None
