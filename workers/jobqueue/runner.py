"""The job runner: the one place a job of any kind is claimed, held, and settled.

A message names some jobs of one kind.  The runner claims them (one transaction), holds them
while the kind's handler works (the heartbeat renews what is held), and settles whatever the
handler leaves: when the process is stopping, unfinished jobs go back unharmed; after an
error, each fails or is retried under the kind's policy (an attempt counted, so a
deterministic error cannot loop); on Ctrl-C they go back, and what cannot be written (the
database restarting) is owed to the heartbeat, which writes it once the database answers.
Handlers (``JobKind.handler``) only do the work and say how each job ended, through the
``Claimed`` the runner gives them; none of them touches a job's status.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from stepq.models import Database, jobs, queries
from stepq.models.errors import LeaseLost
from stepq.workers.jobqueue.held_jobs import HeldJobs
from stepq.workers.jobqueue.job_kind import JobKind, is_permanent
from stepq.workers.jobqueue.logcontext import bind

if TYPE_CHECKING:
    from stepq.workers.jobqueue.runtime import WorkerRuntime

log = logging.getLogger("stepq.worker")


class Claimed:
    """The jobs of one message this process claimed, while the handler works on them.

    ``finish``/``renew`` are fenced writes inside the handler's own transaction (a result and
    its job's end commit together; a lost lease raises ``LeaseLost`` and rolls the result
    back).  ``record`` notes how a job ended once that committed; ``fail`` settles a job after
    an error of its own.  Thread-safe: a write-behind thread may settle a job later."""

    def __init__(self, rt: WorkerRuntime, kind: JobKind, ids: Sequence[int]) -> None:
        self.rt, self.kind, self.ids = rt, kind, list(ids)
        self.outcomes: dict[int, str] = {}
        self._lock = threading.Lock()

    @property
    def stopping(self) -> bool:
        """The process is asked to stop: return at the next safe point; the runner hands back
        whatever is unsettled."""
        return self.rt.stopping.is_set()

    def renew(self, session: Session, job_id: int) -> None:
        """The fence before an intermediate write: the lease is still ours (and now longer)."""
        if not jobs.renew(session, self.kind.table, [job_id], self.rt.name, self.rt.options.lease_ttl_s):
            raise LeaseLost(f"lease on {self.kind.table.name} job {job_id} was taken over")

    def finish(self, session: Session, job_id: int, **values: Any) -> None:
        """End the job (done, with ``values``) in the transaction that writes its result."""
        if not jobs.finish(session, self.kind.table, job_id, self.rt.name, **values):
            raise LeaseLost(f"lease on {self.kind.table.name} job {job_id} was taken over")

    def record(self, job_id: int, status: str) -> None:
        """How a job ended (done, lost, writing: a write-behind thread settles it)."""
        with self._lock:
            self.outcomes[job_id] = status
        if status == "done":
            self.rt.health.done()

    def fail(self, job_id: int, exc: BaseException, **log_extra: Any) -> str:
        """Settle one job after its own error, under the kind's retry policy."""
        status = fail(self.rt.db, self.kind, job_id, self.rt.name, exc, **log_extra)
        self.record(job_id, status)
        self.rt.health.failed(exc)
        return status

    def hand_back(self, job_id: int) -> None:
        """Return one job unharmed, its attempt not counted."""
        hand_back(self.rt.db, {self.kind: [job_id]}, self.rt.name)
        self.record(job_id, "handed-back")

    def one_by_one(self, work: Callable[[int], bool]) -> None:
        """For handlers that do one job at a time: ``work(job_id)`` returns whether it ended the
        job (False: it stopped for the process's stop, and the runner hands the job back); a lost
        lease and an error of the job's own are settled here."""
        for job_id in self.ids:
            if self.stopping:
                return
            try:
                if work(job_id):
                    self.record(job_id, "done")
            except LeaseLost as exc:
                log.warning("%s", exc)
                self.record(job_id, "lost")
            except Exception as exc:  # an attempt counted, retried with backoff unless permanent
                self.fail(job_id, exc)

    def unsettled(self) -> list[int]:
        with self._lock:
            return [i for i in self.ids if i not in self.outcomes]


def run_jobs(rt: WorkerRuntime, kind: JobKind, ids: Sequence[int]) -> dict[int, str]:
    """Run the jobs one message names; returns each job's status: done, skipped (someone else
    has it), lost, retry, failed, handed-back, or writing (a write-behind thread finishes it).
    Safe to call twice for the same ids, at once or later."""
    ids = list(ids)
    if rt.stopping.is_set() or not rt.health.healthy:  # none is claimed: the dispatcher republishes them
        return dict.fromkeys(ids, "handed-back")
    claimed = Claimed(rt, kind, [])
    with rt.held.holding(kind, ids), bind(worker=rt.name, item=ids[0] if len(ids) == 1 else ids):
        try:
            with rt.db.session() as s:
                claimed.ids = [i for i in ids if jobs.claim(s, kind.table, i, rt.name, rt.options.lease_ttl_s)]
            if claimed.ids:
                kind.handler(rt, claimed)
        except BaseException as exc:
            # whatever escaped the handler (a database error loading the next job, a bug,
            # SystemExit, Ctrl-C): what it claimed and did not settle is released, then on its way
            unsettled = claimed.unsettled()
            release_unfinished(rt.db, kind, unsettled, rt.name, exc, rt.held)
            for _ in unsettled:
                rt.health.failed(exc)
            raise
        left = claimed.unsettled()
        if left:
            hand_back(rt.db, {kind: left}, rt.name)
            for job_id in left:
                claimed.record(job_id, "handed-back")
            if rt.stopping.is_set():
                log.info("stopping: handed back %d %s jobs after the work in flight", len(left), kind.table.name)
            else:
                log.warning("the %s handler left jobs %s unsettled; handed them back", kind.table.name, left)
    return {i: claimed.outcomes.get(i, "skipped") for i in ids}


def fail(db: Database, kind: JobKind, job_id: int, owner: str, exc: BaseException, **log_extra: Any) -> str:
    """Record a failed job: failed for good, or pending again after the policy's backoff;
    returns "failed", "retry" or "lost" (another worker holds it now)."""
    permanent = is_permanent(exc)
    outcome = "unrecorded"  # stays so when the database does not answer
    try:
        with db.session() as s:
            outcome = jobs.fail_or_retry(
                s, kind.table, job_id, owner, f"{type(exc).__name__}: {exc}", kind.retry.decide, permanent=permanent
            )
            queries.count_event(s, {"failed": "items_failed", "retry": "retries"}.get(outcome, "lost_leases"))
    finally:  # said after the decision: "will retry" was logged for a job whose last attempt it was
        how = {
            "retry": "will retry",
            "lost": "another worker holds it now",
            "unrecorded": "not recorded: the database did not answer",
        }.get(outcome, "permanent" if permanent else "no attempts left")
        log.error(
            "%s job %s failed (%s): %s: %s",
            kind.table.name,
            job_id,
            how,
            type(exc).__name__,
            exc,
            extra={"item": job_id, **log_extra},
        )
    return outcome


def release_unfinished(
    db: Database,
    kind: JobKind,
    job_ids: Sequence[int],
    owner: str,
    exc: BaseException,
    held: HeldJobs | None = None,
) -> None:
    """Whatever escaped a handler: each job it claimed and did not settle fails or retries.  An
    operator's stop (Ctrl-C: ``KeyboardInterrupt``) is no failure: the jobs go back unharmed.
    What cannot be written now (the database restarting) is owed to ``held``: the process's
    heartbeat writes it as soon as the database answers, rather than leaving the jobs running
    with nobody on them until their leases expire."""

    def settle(job_id: int) -> None:
        if isinstance(exc, KeyboardInterrupt):
            hand_back(db, {kind: [job_id]}, owner)
        else:
            fail(db, kind, job_id, owner, exc)

    for job_id in job_ids:
        try:
            settle(job_id)
        except Exception as err:
            if held is None:
                log.warning("could not release %s job %s (%s); its lease will expire", kind.table.name, job_id, err)
            else:
                log.warning(
                    "could not release %s job %s (%s); will once the database answers", kind.table.name, job_id, err
                )
                held.owe(partial(settle, job_id))


def hand_back(db: Database, held: dict[JobKind, list[int]], owner: str) -> int:
    """Return held jobs unharmed (the process is stopping, or a call hung): pending again,
    the attempt not counted.  Returns how many went back."""
    back = 0
    with db.session() as s:
        for kind, ids in held.items():
            back += sum(jobs.hand_back(s, kind.table, job_id, owner) for job_id in ids)
    return back
