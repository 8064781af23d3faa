"""The job queue on the workers' side: what a kind of work is, the retry policy, the jobs a
process holds, and how a task that fails or stops settles what it claimed.

The SQL is ``stepq.models.jobs`` (one lifecycle for every table of queue work); this module
is the policy around it, written once: a handler (rollouts, step searches, ...) claims its
jobs, does the work, and finishes them; everything else (renewing leases while it runs,
failing or retrying with backoff after an error, handing work back when the process stops
or a call hangs) happens here and in the dispatcher, the same for every kind.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from stepq.models import Database, jobs, queries
from stepq.models.errors import ConfigError, GenerationError
from stepq.models.jobs import JobTable

if TYPE_CHECKING:
    from stepq.workers.labelling.rollouts import WorkerRuntime

log = logging.getLogger("stepq.worker")

Handler = Callable[["WorkerRuntime", list[int]], dict[int, str]]
"""Runs some jobs of one kind in a worker; returns each job's status (done, skipped, lost,
retry, failed, handed-back)."""


@dataclass(frozen=True)
class JobKind:
    """One kind of queue work: its table, its Celery task, the code that runs it, and how many
    jobs go in one broker message by default (a message is what the broker bound counts)."""

    table: JobTable
    task_name: str
    handler: Callable[[], Handler]
    """Imported when first run, so publishing needs none of the workers' dependencies."""
    per_message: int = 1


@dataclass(frozen=True)
class Outlet:
    """Where the dispatcher publishes one kind's pending jobs: ``publish(ids)`` sends them as
    messages of ``per_message`` ids each."""

    kind: JobKind
    publish: Callable[[Sequence[int]], None]
    per_message: int = 1


@dataclass(frozen=True)
class RetryPolicy:
    """When a failed job is tried again, and when it is given up on: every kind of work fails
    the same way (a permanent error at once, else after ``max_attempts`` tries, waiting
    ``backoff_s`` doubled per attempt, at most ``max_backoff_s``, in between)."""

    max_attempts: int = 5
    backoff_s: float = 5.0
    max_backoff_s: float = 600.0

    def decide(self, attempts: int, permanent: bool) -> tuple[bool, float]:
        give_up = permanent or attempts >= self.max_attempts
        return give_up, min(self.backoff_s * 2 ** max(0, attempts - 1), self.max_backoff_s)


def is_permanent(exc: BaseException) -> bool:
    """A bad setting or a request the engine refuses for good: trying again cannot help."""
    return isinstance(exc, ConfigError) or (isinstance(exc, GenerationError) and exc.permanent)


def fail(
    db: Database, table: JobTable, job_id: int, owner: str, exc: BaseException, policy: RetryPolicy, **log_extra: Any
) -> str:
    """Record a failed job: failed for good, or pending again after the policy's backoff;
    returns "failed", "retry" or "lost" (another worker holds it now)."""
    permanent = is_permanent(exc)
    log.error(
        "%s job %s failed (%s): %s: %s",
        table.name,
        job_id,
        "permanent" if permanent else "will retry",
        type(exc).__name__,
        exc,
        extra={"item": job_id, **log_extra},
    )
    with db.session() as s:
        outcome = jobs.fail_or_retry(
            s, table, job_id, owner, f"{type(exc).__name__}: {exc}", policy.decide, permanent=permanent
        )
        queries.count_event(s, {"failed": "items_failed", "retry": "retries"}.get(outcome, "lost_leases"))
    return outcome


class PartlyPublished(Exception):
    """A publish that failed part-way (the broker full or gone mid-batch): ``sent`` are the job
    ids whose messages did reach the broker, so only the others go back to pending (putting
    them all back published the sent ones twice)."""

    def __init__(self, sent: Sequence[int], cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.sent = list(sent)


def release_unfinished(
    db: Database,
    table: JobTable,
    job_ids: Sequence[int],
    owner: str,
    exc: BaseException,
    policy: RetryPolicy,
    held: HeldJobs | None = None,
) -> None:
    """Whatever escaped a task (a database error, a bug, SystemExit): each job it claimed and
    did not settle fails or retries (an attempt counted, so a deterministic error cannot
    loop).  An operator's stop (Ctrl-C: ``KeyboardInterrupt``) is no failure: the jobs go back
    unharmed.  What cannot be written now (the database restarting) is owed to ``held``: the
    process's heartbeat writes it as soon as the database answers, rather than leaving the jobs
    running with nobody on them until their leases expire."""

    def settle(job_id: int) -> None:
        if isinstance(exc, KeyboardInterrupt):
            hand_back(db, {table: [job_id]}, owner)
        else:
            fail(db, table, job_id, owner, exc, policy)

    for job_id in job_ids:
        try:
            settle(job_id)
        except Exception as err:
            if held is None:
                log.warning("could not release %s job %s (%s); its lease will expire", table.name, job_id, err)
            else:
                log.warning("could not release %s job %s (%s); will once the database answers", table.name, job_id, err)
                held.owe(partial(settle, job_id))


def hand_back(db: Database, held: dict[JobTable, list[int]], owner: str) -> int:
    """Return held jobs unharmed (the process is stopping, or a call hung): pending again,
    the attempt not counted.  Returns how many went back."""
    back = 0
    with db.session() as s:
        for table, ids in held.items():
            back += sum(jobs.hand_back(s, table, job_id, owner) for job_id in ids)
    return back


class HeldJobs:
    """The jobs this process holds now, per table: exactly what its heartbeat renews.  A task
    registers its jobs for as long as it runs (``holding``), and the write-behind thread for as
    long as it still has a job's batch to commit (``hold``/``release``); once nothing holds a
    job, nothing renews it and its lease runs out.  Counted, so the two can overlap."""

    def __init__(self) -> None:
        self._held: dict[JobTable, Counter[int]] = {}
        self._owed: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    @contextmanager
    def holding(self, table: JobTable, ids: Sequence[int]) -> Iterator[None]:
        self.hold(table, ids)
        try:
            yield
        finally:
            self.release(table, ids)

    def hold(self, table: JobTable, ids: Sequence[int]) -> None:
        with self._lock:
            self._held.setdefault(table, Counter()).update(ids)

    def release(self, table: JobTable, ids: Sequence[int]) -> None:
        with self._lock:
            held = self._held[table]
            held.subtract(ids)
            for i in ids:
                if held.get(i, 0) <= 0:
                    held.pop(i, None)

    def now(self) -> dict[JobTable, list[int]]:
        with self._lock:
            return {table: sorted(ids) for table, ids in self._held.items() if ids}

    def __len__(self) -> int:
        with self._lock:
            return sum(len(ids) for ids in self._held.values())

    def owe(self, settle: Callable[[], None]) -> None:
        """A release that could not be written; ``settle_owed`` tries it again."""
        with self._lock:
            self._owed.append(settle)

    def settle_owed(self) -> int:
        """Write the owed releases that can be written now; returns how many were."""
        with self._lock:
            owed, self._owed = self._owed, []
        done = 0
        for settle in owed:
            try:
                settle()
                done += 1
            except Exception:
                with self._lock:
                    self._owed.append(settle)
        return done

    def renew(self, session: Session, owner: str, ttl: float) -> int:
        """Extend the leases on every job held now; returns how many this process still holds."""
        return sum(jobs.renew(session, table, ids, owner, ttl) for table, ids in self.now().items())
