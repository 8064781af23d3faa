"""What a worker process keeps between tasks: its database, the jobs it holds (renewed by its
heartbeat), its write-behind thread, the deadline that bounds a call that may hang, and the
engines its handlers work with (``workers.engines``: grader, warm backends, judge factory;
the queue only closes them).  The same object in a Celery worker and in the embedded runner;
``stepq.assembly`` builds it the one way every front end uses."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stepq.models import Database
from stepq.models.errors import GenerationError
from stepq.workers.jobqueue.health import Health
from stepq.workers.jobqueue.heartbeat import Heartbeat
from stepq.workers.jobqueue.held_jobs import HeldJobs
from stepq.workers.jobqueue.runner import fail
from stepq.workers.jobqueue.write_behind import WriteBehind

if TYPE_CHECKING:
    from stepq.workers.engines import Engines

log = logging.getLogger("stepq.worker")
GENERATE_TIMEOUT_EXIT = 69
"""EX_UNAVAILABLE: the engine stopped answering; the supervisor (Celery, compose) restarts us."""


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker process behaves; built from the settings by the front end."""

    lease_ttl_s: float = 300.0
    batch_rollouts: int = 128
    name: str | None = None
    """The operator's label for the process; its unique name adds host, pid and a random part."""
    store_text: bool = True
    """Keep each rollout's text; off keeps only answer, reward and tokens (~2 KB less a row)."""
    heartbeat_s: float = 10.0
    """Seconds between heartbeats (at most a third of the lease, whatever is set)."""
    generate_timeout_s: float = 0.0
    """A generate call (or a search turn) still running after this long is presumed hung: its
    work is handed back and the process exits (``GENERATE_TIMEOUT_EXIT``) for its supervisor to
    restart it.  0: no deadline."""
    unhealthy_after: int = 0
    """Failed jobs in a row (transient errors) after which the process stops taking work and
    reports itself unhealthy (``jobqueue.health``); 0: never (a queue worker's setting:
    ``STEPQ_UNHEALTHY_AFTER``)."""
    hands_back_refused: bool = False
    """Work of a set another generator samples goes back for another worker (a fleet worker);
    off, it fails with the reason (the embedded runner: no other worker would take it)."""
    write_behind: bool = False
    """Commit a trajectory's last batch on a background thread while the next task generates
    (``write_behind``); a queue worker's setting, not the embedded runner's, which reports each
    item as it is done."""

    @property
    def heartbeat_interval_s(self) -> float:
        return max(0.05, min(self.heartbeat_s, self.lease_ttl_s / 3))


@dataclass
class WorkerRuntime:
    """What a worker process keeps between tasks: its database, held jobs and engines."""

    db: Database
    options: WorkerOptions
    engines: Engines

    def __post_init__(self) -> None:
        self.label = self.options.name or "worker"
        # Unique per process: every host may run workers under the same --name, and a
        # lease must never be mistaken for another process's.
        self.name = f"{self.label}@{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.held = HeldJobs()
        self.health = Health(self.options.unhealthy_after)
        self.refused: str | None = None
        """The latest work this process refused, and why (heartbeat: ``stepq status`` shows it)."""
        """Whether the process still takes work: not after ``unhealthy_after`` failed jobs in a row."""
        """The jobs (of every kind) this process's running tasks hold: what the heartbeat renews."""
        self.writer = WriteBehind(self.held) if self.options.write_behind else None
        self.engine_s = 0.0
        """Seconds spent inside generate calls (metrics: engine time per worker)."""
        self.grades: Counter[str] = Counter()
        """Rollouts graded, per grading method (metrics: grading outcomes per worker)."""
        self.stopping = threading.Event()
        """Set when the process is asked to stop: tasks hand their items back after the batch
        in flight instead of finishing them."""
        self.heartbeat = Heartbeat(
            self.db,
            self.name,
            label=self.label,
            interval_s=self.options.heartbeat_interval_s,
            lease_ttl_s=self.options.lease_ttl_s,
            busy=lambda: len(self.held),
            backend=lambda: self.engines.generator,
            totals=lambda: (self.engine_s, dict(self.grades)),
            held=self.held,
            unhealthy=lambda: self.health.reason,
            refused=lambda: self.refused,
        )

    def request_stop(self) -> None:
        self.stopping.set()

    def start(self) -> WorkerRuntime:
        """Start the heartbeat (live worker, renewed leases); ``close`` stops it."""
        self.heartbeat.start()
        return self

    @property
    def busy_items(self) -> int:
        return len(self.held)

    @contextmanager
    def deadline(self, what: str) -> Iterator[None]:
        """Bound a call that may hang in an engine or a server (``generate_timeout_s``): the
        heartbeat would renew its leases for ever, so past the deadline the work goes back
        and the process goes down (a thread stuck in native code cannot be stopped)."""
        limit = self.options.generate_timeout_s
        if not limit:
            yield
            return
        timer = threading.Timer(limit, self._deadline_passed, args=(what, limit))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _deadline_passed(self, what: str, limit: float) -> None:
        held = self.held.now()
        log.error(
            "%s did not return within %.0f s (STEPQ_GENERATE_TIMEOUT_S): failing %s (an attempt each), and "
            "exiting for the supervisor to restart this worker",
            what,
            limit,
            ", ".join(f"{len(ids)} {kind.table.name} jobs" for kind, ids in held.items()) or "nothing",
        )
        # A hang counts as an attempt, with its error recorded: a request that always hangs the
        # engine gives up after the retry policy's limit instead of being retried for ever.
        hung = GenerationError(f"{what} did not return within {limit:.0f} s (STEPQ_GENERATE_TIMEOUT_S)")
        try:
            for kind, ids in held.items():
                for job_id in ids:
                    fail(self.db, kind, job_id, self.name, hung)
        except Exception as exc:  # their leases, no longer renewed once we are gone, expire
            log.error("could not record the hung work (%s); its leases will expire", exc)
        logging.shutdown()
        os._exit(GENERATE_TIMEOUT_EXIT)

    def close(self) -> None:
        if self.writer is not None:  # while the heartbeat still renews what it holds
            self.writer.close()
        self.heartbeat.stop()
        self.engines.close()
