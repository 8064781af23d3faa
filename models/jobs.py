"""The job queue's SQL: one lifecycle for every kind of leased queue work.

A kind of work (a trajectory's rollouts, a step search, ...) is a table whose rows carry
the ``LeasedJob`` columns, described once by a ``JobTable``; every function here takes
that description, so claiming, renewing, handing back, finishing, failing or retrying,
publishing and recovering are written once.  States::

    pending --publish--> queued --claim--> running --finish--> done
       ^                   |                  | fail_or_retry (backoff) / lease expired
       +-------------------+------------------+--> failed (permanent, or out of attempts)

The broker carries only ids; everything a worker needs and every decision is in the row,
so losing the broker loses no work.  Ownership changes only through the lease primitive's
conditional updates (``leases``).  How long to back off and when to give up is the worker's
retry policy (``stepq.workers.jobqueue.job_kind.RetryPolicy``), passed in as ``decide``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Boolean, Float, Integer, String, Text, and_, case, false, func, or_, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from stepq.models import leases
from stepq.models.base import epoch
from stepq.models.wakeup import announce

PENDING = "pending"
QUEUED = "queued"
RUNNING = "running"
DONE = "done"
FAILED = "failed"

Decide = Callable[[int, bool], tuple[bool, float]]
"""(attempts so far, permanent error) -> (give up, seconds to wait before the next try)."""


class LeasedJob:
    """The columns every kind of queue work has (a declarative mixin); times are epoch s."""

    state: Mapped[str] = mapped_column(String(20), default=PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    enqueue_count: Mapped[int] = mapped_column(Integer, default=0)
    enqueued_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    retry_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """A transient failure's backoff: the job is not published again before this moment."""
    rerun: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """What the job works from changed while it ran: it goes back to pending, not done."""


@dataclass(frozen=True, eq=False)
class JobTable:
    """One kind of queue work as the database sees it.  ``set_of`` is the problem set a row
    belongs to (a SQL expression, correlated to the row: pausing the set pauses the job);
    ``in_set(id)`` the cheapest filter for one set's rows."""

    name: str
    model: Any
    set_of: Callable[[], Any]
    in_set: Callable[[int], Any]
    dispatch_order: Callable[[], tuple[Any, Any]] | None = None
    """(set column, key column) for work published fairly across sets and in key order
    within each (``pending_ids``); None: plain id order."""

    def paused(self) -> Any:
        from stepq.models.problems import ProblemSet

        return select(ProblemSet.paused).where(ProblemSet.id == self.set_of()).scalar_subquery()

    def touch(self, now: float) -> dict[str, float]:
        """Tables that keep ``updated_at`` get it set by every transition."""
        return {"updated_at": now} if "updated_at" in self.model.__table__.c else {}


# --- publishing ------------------------------------------------------------------------


def pending_ids(
    session: Session,
    t: JobTable,
    limit: int,
    now: float | None = None,
    first_set: int = 0,
    skip_sets: Collection[int] = (),
) -> list[int]:
    """Pending jobs to publish next, leaving out those backing off and those of paused sets.

    In id order, or, for a table with a ``dispatch_order``, fairly across sets (one job of
    each set in turn, starting ``first_set`` sets along, so a tight bound still reaches every
    set over successive calls) and in key order within each.  Each read walks an index
    ((state, id), or (set, state, key, id) per set): its cost follows ``limit`` and the
    number of sets, not the table.  ``skip_sets``: sets whose work waits (its new order is
    being scored)."""
    now = epoch() if now is None else now
    m = t.model
    ready = and_(m.state == PENDING, or_(m.retry_at.is_(None), m.retry_at <= now))
    if t.dispatch_order is None:
        return list(session.scalars(select(m.id).where(ready, t.paused().is_(False)).order_by(m.id).limit(limit)))
    from stepq.models.problems import ProblemSet

    set_column, key = t.dispatch_order()
    active = select(ProblemSet.id).where(ProblemSet.paused.is_(False)).order_by(ProblemSet.id)
    sets = [sid for sid in session.scalars(active) if sid not in skip_sets]
    if sets:
        turn = first_set % len(sets)
        sets = sets[turn:] + sets[:turn]
    queues = [
        list(session.scalars(select(m.id).where(set_column == sid, ready).order_by(key, m.id).limit(limit)))
        for sid in sets
    ]
    return take_in_turn(queues, limit)


def take_in_turn(queues: Sequence[Sequence[int]], limit: int) -> list[int]:
    """One from each queue in turn until ``limit`` or all are empty."""
    out: list[int] = []
    depth = 0
    while len(out) < limit and any(depth < len(q) for q in queues):
        out.extend(q[depth] for q in queues if depth < len(q))
        depth += 1
    return out[:limit]


def next_retry_at(session: Session, t: JobTable) -> float | None:
    """When the earliest pending job that is backing off may be tried again (None: none)."""
    m = t.model
    return session.scalar(select(func.min(m.retry_at)).where(m.state == PENDING, m.retry_at.is_not(None)))


def queued_count(session: Session, t: JobTable) -> int:
    """Jobs whose message is (or may be) in the broker: waiting, or reserved by a worker that
    has not claimed it yet."""
    m = t.model
    return int(session.scalar(select(func.count()).select_from(m).where(m.state == QUEUED)) or 0)


def queued_ids(session: Session, t: JobTable, before: float | None = None) -> list[int]:
    """Jobs marked queued (before ``before``: candidates for a lost message)."""
    m = t.model
    queued = select(m.id).where(m.state == QUEUED)
    if before is not None:
        queued = queued.where(m.enqueued_at < before)
    return list(session.scalars(queued.order_by(m.id)))


def mark_queued(session: Session, t: JobTable, ids: Sequence[int], now: float) -> list[int]:
    """pending -> queued for those of ``ids`` still pending; returns them, in the order given
    (another dispatcher may have taken the rest).  Their messages are published after this commits."""
    if not ids:
        return []
    m = t.model
    result = session.execute(
        update(m)
        .where(m.id.in_(list(ids)), m.state == PENDING)
        .values(state=QUEUED, enqueued_at=now, enqueue_count=m.enqueue_count + 1, **t.touch(now))
        .returning(m.id)
    )
    marked = {int(i) for i in result.scalars()}
    return [i for i in ids if i in marked]  # in the order given: the order they are published in


def unmark_queued(session: Session, t: JobTable, ids: Sequence[int]) -> None:
    """queued -> pending, for jobs whose message could not be published (or was lost)."""
    if ids:
        m = t.model
        session.execute(
            update(m)
            .where(m.id.in_(list(ids)), m.state == QUEUED)
            .values(state=PENDING, enqueued_at=None)
            .execution_options(synchronize_session=False)
        )


def expire_leases(session: Session, t: JobTable, now: float, max_attempts: int) -> tuple[int, int]:
    """Running jobs whose holder stopped renewing go back to pending, or fail once they have
    had ``max_attempts`` tries.  Returns (back to pending, failed)."""
    m = t.model
    expired = and_(m.state == RUNNING, m.lease_expires_at < now)
    failed = session.execute(
        update(m)
        .where(expired, m.attempts >= max_attempts)
        .values(state=FAILED, lease_owner=None, lease_expires_at=None, last_error="lease expired too many times")
    )
    back = session.execute(
        update(m).where(expired).values(state=PENDING, lease_owner=None, lease_expires_at=None, enqueued_at=None)
    )
    return int(back.rowcount or 0), int(failed.rowcount or 0)  # type: ignore[attr-defined]


# --- a worker's side -------------------------------------------------------------------


def claim(session: Session, t: JobTable, job_id: int, owner: str, ttl: float) -> bool:
    """Take the lease on a job that is pending, queued, or running under an expired lease
    (its worker died); never one that is done, failed, held live, or of a paused set."""
    m = t.model
    where = and_(m.id == job_id, m.state.in_([PENDING, QUEUED, RUNNING]), t.paused().is_(False))
    values = {"state": RUNNING, "attempts": m.attempts + 1, "rerun": False, "retry_at": None, **t.touch(epoch())}
    return leases.take(session, m, where, owner, ttl, **values)


def renew(session: Session, t: JobTable, ids: Sequence[int], owner: str, ttl: float) -> int:
    """Extend this process's leases on the running jobs ``ids``; returns how many it holds."""
    if not ids:
        return 0
    m = t.model
    return leases.renew(session, m, and_(m.id.in_(list(ids)), m.state == RUNNING), owner, ttl, **t.touch(epoch()))


def hand_back(session: Session, t: JobTable, job_id: int, owner: str) -> bool:
    """A stopping worker returns a job unharmed: pending again, the attempt not counted."""
    m = t.model
    values = {"state": PENDING, "enqueued_at": None, "attempts": m.attempts - 1, **t.touch(epoch())}
    return leases.release(session, m, and_(m.id == job_id, m.state == RUNNING), owner, **values)


def finish(session: Session, t: JobTable, job_id: int, owner: str, **values: Any) -> bool:
    """running -> done (with ``values``), only for the lease holder; False when the lease was
    lost.  A job marked ``rerun`` while it ran goes back to pending instead."""
    m = t.model
    now = epoch()
    again = m.rerun.is_(True)
    ending = {
        "state": case((again, PENDING), else_=DONE),
        "finished_at": case((again, None), else_=now),
        "attempts": case((again, 0), else_=m.attempts),
        "rerun": False,
        "last_error": None,
        **t.touch(now),
        **values,
    }
    return leases.release(session, m, and_(m.id == job_id, m.state == RUNNING), owner, **ending)


def fail_or_retry(
    session: Session, t: JobTable, job_id: int, owner: str, error: str, decide: Decide, *, permanent: bool = False
) -> str:
    """After an error: back to pending after the policy's backoff, or failed.  The write is a
    compare-and-set on what the policy decided from (still ours, still running, the same
    attempts), so no row lock is needed: if anything took the job in between (its lease
    expired and another worker, or another task of this process, claimed it), nothing is
    written and the answer is "lost"."""
    m = t.model
    mine = and_(m.id == job_id, m.lease_owner == owner, m.state == RUNNING)
    attempts = session.scalar(select(m.attempts).where(mine))
    if attempts is None:
        return "lost"
    give_up, delay = decide(int(attempts), permanent)
    now = epoch()
    outcome = {
        "state": FAILED if give_up else PENDING,
        "retry_at": None if give_up else now + delay,
        "enqueued_at": None,
        "last_error": ("permanent: " if permanent else "") + error[:2000],
        **t.touch(now),
    }
    if not leases.release(session, m, and_(mine, m.attempts == attempts), owner, **outcome):
        return "lost"
    return "failed" if give_up else "retry"


# --- operators -------------------------------------------------------------------------


def retry_failed(session: Session, t: JobTable, set_id: int | None = None) -> int:
    """Failed jobs (of one set, or all) get a fresh set of attempts."""
    m = t.model
    stmt = update(m).where(m.state == FAILED)
    if set_id is not None:
        stmt = stmt.where(t.in_set(set_id))
    result = session.execute(
        stmt.values(state=PENDING, attempts=0, last_error=None, retry_at=None).execution_options(
            synchronize_session=False
        )
    )
    if result.rowcount:  # type: ignore[attr-defined]
        announce(session)
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def failed_in_set(session: Session, t: JobTable, set_id: int) -> tuple[int, str | None]:
    """How many of a set's jobs failed, and the latest of their errors (counted in the
    database, one error read: a million failed jobs cost what ten do)."""
    m = t.model
    failed = and_(m.state == FAILED, t.in_set(set_id))
    count = int(session.scalar(select(func.count()).select_from(m).where(failed)) or 0)
    latest = session.scalar(
        select(m.last_error).where(failed, m.last_error.is_not(None)).order_by(m.id.desc()).limit(1)
    )
    return count, latest


def troubles(session: Session, t: JobTable) -> dict[int, dict[str, Any]]:
    """set id -> failed jobs, jobs backing off after a transient error, and the latest error.
    Counted in the database over the troubled rows only (the retry_at and state indexes), one
    error read per set: a status or metrics scrape costs the same with ten or a million."""
    m = t.model
    troubled = or_(m.state == FAILED, m.retry_at.is_not(None))
    set_id = t.set_of().label("set_id")
    is_failed = (m.state == FAILED).label("is_failed")
    out: dict[int, dict[str, Any]] = {}
    counts = session.execute(select(set_id, is_failed, func.count()).where(troubled).group_by(set_id, is_failed))
    for sid, failed, n in counts:
        entry = out.setdefault(int(sid), {"failed": 0, "retrying": 0, "last_error": None})
        entry["failed" if failed else "retrying"] += int(n)
    for sid in out:
        out[sid]["last_error"] = session.scalar(
            select(m.last_error)
            .where(troubled, t.in_set(sid), m.last_error.is_not(None))
            .order_by(m.id.desc())
            .limit(1)
        )
    return out
