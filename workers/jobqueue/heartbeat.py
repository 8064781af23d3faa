"""A worker process's heartbeat: it keeps the process visible and the leases of the jobs its
tasks hold (of every kind of queue work) alive.

Without it a lease would be renewed only when a batch commits, and one ``generate`` call
longer than the lease (a slow server, a long batch) would lose the work it is doing.  The
beat runs on its own thread, so it goes on while the main thread waits on an engine; it
also tells the dispatcher (which sizes the broker queue by live workers) and operators
(``stepq status``: live, busy and idle workers) that the process is there.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

from sqlalchemy.orm import Session

from stepq.models import Database, queries
from stepq.workers.jobqueue.held_jobs import HeldJobs
from stepq.workers.jobqueue.logcontext import bind

log = logging.getLogger("stepq.worker")


class Heartbeat:
    """Beats every ``interval_s`` until stopped; each beat renews the leases of the jobs the
    process's running tasks hold now (``held``), nothing else."""

    def __init__(
        self,
        db: Database,
        name: str,
        *,
        label: str,
        interval_s: float,
        lease_ttl_s: float,
        busy: Callable[[], int],
        backend: Callable[[], str],
        totals: Callable[[], tuple[float, dict[str, int]]] = lambda: (0.0, {}),
        held: HeldJobs | None = None,
        unhealthy: Callable[[], str | None] = lambda: None,
        refused: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.db, self.name, self.label = db, name, label
        self.interval_s, self.lease_ttl_s = interval_s, lease_ttl_s
        self.busy, self.backend, self.totals, self.unhealthy = busy, backend, totals, unhealthy
        self.refused = refused
        self.held = held if held is not None else HeldJobs()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.beats = 0

    def beat(self) -> int:
        """One beat; returns how many leases it renewed.  Releases a task could not write (the
        database was restarting) are written first."""
        self.held.settle_owed()
        with self.db.session() as s:
            renewed = self.held.renew(s, self.name, self.lease_ttl_s)
            self.write(s)
        self.beats += 1
        return renewed

    def write(self, session: Session, *, rollouts: int = 0, tokens: int = 0) -> None:
        """The worker's row, in ``session``: alive now, and ``rollouts`` and ``tokens`` more
        done (a handler writes it in the transaction that stores them, so the counts and the
        rows commit together).  The one writer of the row."""
        engine_s, grades = self.totals()
        queries.heartbeat(
            session,
            self.name,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            backend=self.backend(),
            rollouts=rollouts,
            tokens=tokens,
            busy_items=self.busy(),
            label=self.label,
            engine_s=engine_s,
            grades=grades,
            unhealthy=self.unhealthy(),
            refused=self.refused(),
        )

    def start(self) -> Heartbeat:
        if self._thread is None:
            self.beat()  # visible at once, before the first task
            self._thread = threading.Thread(target=self._run, name="stepq-heartbeat", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        with bind(worker=self.name):
            self._beat_until_stopped()

    def _beat_until_stopped(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except Exception as exc:  # a database blip must not kill the beat
                log.warning("heartbeat failed: %s: %s", type(exc).__name__, exc)

    def stop(self) -> None:
        """Stop beating and mark the worker stopped (it stops counting as live at once); also
        for a runtime that never started the thread but wrote heartbeats with its batches."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=self.interval_s + 5)
            self._thread = None
        try:
            with self.db.session() as s:
                queries.worker_stopped(s, self.name)
        except Exception as exc:
            log.warning("could not mark worker %s stopped: %s", self.name, exc)
