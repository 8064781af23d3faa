"""The work lifecycle: planning rollout work, publishing, leases, hand-back, failure and retry.

Part of ``stepq.models.queries`` (import them from there); the same rules hold: no SQL
outside ``models``, idempotent writes, conditional updates for ownership.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, case, func, or_, select, update
from sqlalchemy.orm import Session

from stepq.models.base import epoch
from stepq.models.counters import SetCounters
from stepq.models.problems import Problem, ProblemSet
from stepq.models.set_queries import _set_trajectories
from stepq.models.sql import insert_ignore
from stepq.models.trajectories import Trajectory
from stepq.models.work import DONE, FAILED, PENDING, QUEUED, RUNNING, RolloutWork

MAX_BACKOFF_S = 600.0
"""The longest a transiently failing item waits before it is published again."""


# --- planning and the work lifecycle -------------------------------------------------


def plan_work(session: Session, set_id: int | None = None) -> int:
    """Make sure every trajectory of an annotated set has work for its set's current M.

    New trajectories get a pending item; items planned for a smaller M are reopened (a
    running one is marked to run again when its task ends, so the new M reaches it too).
    Returns how many items were created or reopened.
    """
    sets = select(ProblemSet.id, ProblemSet.rollouts_per_prefix).where(ProblemSet.rollouts_per_prefix > 0)
    if set_id is not None:
        sets = sets.where(ProblemSet.id == set_id)
    else:  # the dispatcher: only sets that gained trajectories since it last looked
        sets = sets.where(ProblemSet.needs_planning.is_(True))
    changed = 0
    for sid, m in session.execute(sets).all():
        # Clear the flag first: a trajectory added while this plans sets it again (and waits
        # for this row), so it is planned next time rather than missed.
        session.execute(update(ProblemSet).where(ProblemSet.id == sid).values(needs_planning=False))
        in_set = (
            select(Trajectory.id)
            .join(Problem, Problem.id == Trajectory.problem_id)
            .where(Problem.problem_set_id == sid, Problem.excluded.is_(False))
        )
        missing = in_set.where(~select(RolloutWork.id).where(RolloutWork.trajectory_id == Trajectory.id).exists())
        rows = [
            {"trajectory_id": tid, "target_m": m, "state": PENDING, "attempts": 0, "enqueue_count": 0}
            for tid in session.scalars(missing)
        ]
        for start in range(0, len(rows), 1000):
            changed += insert_ignore(session, RolloutWork, rows[start : start + 1000])
        smaller = and_(RolloutWork.trajectory_id.in_(in_set), RolloutWork.target_m < m)
        running = session.execute(
            update(RolloutWork)
            .where(smaller, RolloutWork.state == RUNNING)
            .values(target_m=m, rerun=True)
            .execution_options(synchronize_session=False)
        )
        queued = session.execute(  # its message is waiting; the task reads the new M
            update(RolloutWork)
            .where(smaller, RolloutWork.state == QUEUED)
            .values(target_m=m)
            .execution_options(synchronize_session=False)
        )
        reopened = session.execute(
            update(RolloutWork)
            .where(smaller, RolloutWork.state.in_([PENDING, DONE, FAILED]))
            .values(target_m=m, state=PENDING, lease_owner=None, lease_expires_at=None, attempts=0, retry_at=None)
            .execution_options(synchronize_session=False)
        )
        changed += sum(int(r.rowcount or 0) for r in (running, queued, reopened))  # type: ignore[attr-defined,misc]
    return changed


def pending_work_ids(session: Session, limit: int, now: float | None = None) -> list[int]:
    """Pending items in id order, leaving out those backing off after a transient failure
    and those of paused sets.  Walks the (state, id) index: its cost follows ``limit``."""
    now = epoch() if now is None else now
    paused = _set_paused(RolloutWork.trajectory_id)
    return list(
        session.scalars(
            select(RolloutWork.id)
            .where(
                RolloutWork.state == PENDING,
                or_(RolloutWork.retry_at.is_(None), RolloutWork.retry_at <= now),
                paused.is_(False),
            )
            .order_by(RolloutWork.id)
            .limit(limit)
        )
    )


def next_retry_at(session: Session) -> float | None:
    """When the earliest pending item that is backing off may be tried again (None: none)."""
    return session.scalar(
        select(func.min(RolloutWork.retry_at)).where(RolloutWork.state == PENDING, RolloutWork.retry_at.is_not(None))
    )


def _set_paused(trajectory_id: Any) -> Any:
    """Whether the set of a trajectory is paused (a correlated scalar subquery)."""
    return (
        select(ProblemSet.paused)
        .join(Problem, Problem.problem_set_id == ProblemSet.id)
        .join(Trajectory, Trajectory.problem_id == Problem.id)
        .where(Trajectory.id == trajectory_id)
        .scalar_subquery()
    )


def queued_count(session: Session) -> int:
    """Items whose message is (or may be) waiting in the broker."""
    return int(session.scalar(select(func.count()).where(RolloutWork.state == QUEUED)) or 0)


def mark_queued(session: Session, ids: Sequence[int], now: float) -> list[int]:
    """pending -> queued for those of ``ids`` still pending; returns them (another
    dispatcher may have taken the rest)."""
    if not ids:
        return []
    result = session.execute(
        update(RolloutWork)
        .where(RolloutWork.id.in_(ids), RolloutWork.state == PENDING)
        .values(state=QUEUED, enqueued_at=now, enqueue_count=RolloutWork.enqueue_count + 1)
        .returning(RolloutWork.id)
    )
    return sorted(int(i) for i in result.scalars())


def unmark_queued(session: Session, ids: Sequence[int]) -> None:
    """queued -> pending, for items whose message could not be published."""
    session.execute(
        update(RolloutWork).where(RolloutWork.id.in_(ids), RolloutWork.state == QUEUED).values(state=PENDING)
    )


def reschedule_expired(session: Session, now: float, max_attempts: int) -> tuple[int, int]:
    """Running items whose lease ran out go back to pending (or failed past max attempts)."""
    expired = and_(RolloutWork.state == RUNNING, RolloutWork.lease_expires_at < now)
    failed = session.execute(
        update(RolloutWork)
        .where(expired, RolloutWork.attempts >= max_attempts)
        .values(state=FAILED, lease_owner=None, last_error="lease expired too many times")
    )
    back = session.execute(
        update(RolloutWork).where(expired).values(state=PENDING, lease_owner=None, lease_expires_at=None)
    )
    return int(back.rowcount or 0), int(failed.rowcount or 0)  # type: ignore[attr-defined]


def requeue_stale(session: Session, older_than: float) -> int:
    """Queued items whose message is lost (queued before ``older_than``) go back to pending;
    the dispatcher decides the cut-off from what the broker says it holds."""
    result = session.execute(
        update(RolloutWork)
        .where(RolloutWork.state == QUEUED, RolloutWork.enqueued_at < older_than)
        .values(state=PENDING)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def claim_work(session: Session, work_id: int, owner: str, ttl: float) -> int | None:
    """Take the lease on a work item; returns its trajectory id, or None when the item is
    done or another worker holds a live lease on it."""
    now = epoch()
    result = session.execute(
        update(RolloutWork)
        .where(
            RolloutWork.id == work_id,
            or_(
                RolloutWork.state.in_([PENDING, QUEUED]),
                and_(RolloutWork.state == RUNNING, RolloutWork.lease_expires_at < now),
            ),
            _set_paused(RolloutWork.trajectory_id).is_(False),
        )
        .values(
            state=RUNNING,
            lease_owner=owner,
            lease_expires_at=now + ttl,
            attempts=RolloutWork.attempts + 1,
            rerun=False,
            retry_at=None,
        )
        .returning(RolloutWork.trajectory_id)
    )
    return result.scalar_one_or_none()


def hand_back(session: Session, work_id: int, owner: str) -> bool:
    """A stopping worker returns an item it holds: pending again, the attempt not counted."""
    result = session.execute(
        update(RolloutWork)
        .where(RolloutWork.id == work_id, RolloutWork.lease_owner == owner, RolloutWork.state == RUNNING)
        .values(
            state=PENDING,
            lease_owner=None,
            lease_expires_at=None,
            attempts=RolloutWork.attempts - 1,  # the claim counted one; handing back is no failure
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def renew_owner_leases(session: Session, owner: str, ttl: float, ids: Sequence[int]) -> int:
    """Extend the leases on ``ids`` that this worker process holds: its heartbeat, so one long
    ``generate`` call does not lose the work.  Only the items a task is working on now are
    named, so an item whose task has ended for any reason is never kept alive."""
    if not ids:
        return 0
    result = session.execute(
        update(RolloutWork)
        .where(RolloutWork.id.in_(list(ids)), RolloutWork.lease_owner == owner, RolloutWork.state == RUNNING)
        .values(lease_expires_at=epoch() + ttl)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def renew_lease(session: Session, work_id: int, owner: str, ttl: float) -> bool:
    result = session.execute(
        update(RolloutWork)
        .where(RolloutWork.id == work_id, RolloutWork.lease_owner == owner, RolloutWork.state == RUNNING)
        .values(lease_expires_at=epoch() + ttl)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def finish_work(session: Session, work_id: int, owner: str) -> bool:
    """running -> done, only for the lease holder; False when the lease was lost.  An item
    whose set changed while it ran (``rerun``) goes back to pending instead."""
    result = session.execute(
        update(RolloutWork)
        .where(RolloutWork.id == work_id, RolloutWork.lease_owner == owner, RolloutWork.state == RUNNING)
        .values(
            state=case((RolloutWork.rerun.is_(True), PENDING), else_=DONE),
            finished_at=case((RolloutWork.rerun.is_(True), None), else_=epoch()),
            attempts=case((RolloutWork.rerun.is_(True), 0), else_=RolloutWork.attempts),
            rerun=False,
            last_error=None,
            lease_owner=None,
            lease_expires_at=None,
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def fail_or_retry(
    session: Session,
    work_id: int,
    owner: str,
    error: str,
    max_attempts: int,
    *,
    permanent: bool = False,
    backoff_s: float = 0.0,
) -> str:
    """After an error: back to pending after a backoff, or failed when the error is
    permanent or attempts ran out.  One conditional update: an item another worker owns
    now (its lease expired and was taken) is left alone and reported "lost"."""
    mine = and_(RolloutWork.id == work_id, RolloutWork.lease_owner == owner, RolloutWork.state == RUNNING)
    attempts = session.scalar(select(RolloutWork.attempts).where(mine).with_for_update())
    if attempts is None:
        return "lost"
    give_up = permanent or attempts >= max_attempts
    delay = min(backoff_s * 2 ** max(0, attempts - 1), MAX_BACKOFF_S)
    result = session.execute(
        update(RolloutWork)
        .where(mine)
        .values(
            state=FAILED if give_up else PENDING,
            retry_at=None if give_up else epoch() + delay,
            last_error=("permanent: " if permanent else "") + error[:2000],
            lease_owner=None,
            lease_expires_at=None,
        )
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        return "lost"
    return "failed" if give_up else "retry"


def reopen_set(session: Session, set_id: int) -> int:
    """Items of a set run again, e.g. after its rule or budget changed: done items go back
    to pending, running ones are marked to go back when their task ends (their task read
    the old settings).  The task works out from the rollouts what is still missing."""
    in_set = RolloutWork.trajectory_id.in_(_set_trajectories(set_id))
    running = session.execute(
        update(RolloutWork)
        .where(RolloutWork.state == RUNNING, in_set)
        .values(rerun=True)
        .execution_options(synchronize_session=False)
    )
    result = session.execute(
        update(RolloutWork)
        .where(RolloutWork.state == DONE, in_set)
        .values(state=PENDING, attempts=0)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0) + int(running.rowcount or 0)  # type: ignore[attr-defined]


def reopen_trajectories(session: Session, trajectory_ids: Sequence[int]) -> int:
    """These trajectories' items run again (done -> pending; running ones when they end)."""
    in_ids = RolloutWork.trajectory_id.in_(trajectory_ids)
    session.execute(update(RolloutWork).where(in_ids, RolloutWork.state == RUNNING).values(rerun=True))
    result = session.execute(
        update(RolloutWork).where(in_ids, RolloutWork.state == DONE).values(state=PENDING, attempts=0)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def mark_trajectory_counted(session: Session, trajectory_id: int, counted: bool) -> None:
    session.execute(
        update(RolloutWork).where(RolloutWork.trajectory_id == trajectory_id).values(trajectory_is_sample=counted)
    )


def trajectory_counted(session: Session, trajectory_id: int) -> bool:
    """Whether the budget counted the trajectory itself as a sample (recorded by its task)."""
    value = session.scalar(select(RolloutWork.trajectory_is_sample).where(RolloutWork.trajectory_id == trajectory_id))
    return bool(value)


def retry_failed(session: Session, set_id: int | None = None) -> int:
    stmt = update(RolloutWork).where(RolloutWork.state == FAILED)
    if set_id is not None:
        stmt = stmt.where(RolloutWork.trajectory_id.in_(_set_trajectories(set_id)))
    result = session.execute(
        stmt.values(state=PENDING, attempts=0, last_error=None).execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def work_counts(session: Session) -> dict[str, int]:
    """Work items per state over every set (from the counters on PostgreSQL)."""
    if session.get_bind().dialect.name == "postgresql":
        states = ("pending", "queued", "running", "done", "failed")
        row = session.execute(select(*(func.sum(getattr(SetCounters, f"work_{st}")) for st in states))).one()
        return {st: int(n) for st, n in zip(states, row, strict=True) if n}
    rows = session.execute(select(RolloutWork.state, func.count()).group_by(RolloutWork.state))
    return {state: int(n) for state, n in rows}


def failed_items(session: Session, set_id: int) -> tuple[int, str | None]:
    """How many of a set's work items failed, and the latest of their errors (counted in the
    database, one error read: a million failed items cost what ten do)."""
    failed = (RolloutWork.state == FAILED) & RolloutWork.trajectory_id.in_(_set_trajectories(set_id))
    count = int(session.scalar(select(func.count()).select_from(RolloutWork).where(failed)) or 0)
    latest = session.scalar(
        select(RolloutWork.last_error)
        .where(failed, RolloutWork.last_error.is_not(None))
        .order_by(RolloutWork.id.desc())
        .limit(1)
    )
    return count, latest


def work_troubles(session: Session) -> dict[int, dict[str, Any]]:
    """set id -> failed items, items backing off after a transient error, and the latest
    error.  Counted in the database (one row per set and state) and one error read per set,
    so a status or metrics scrape costs the same with ten failed items or a million."""
    out: dict[int, dict[str, Any]] = {}
    troubled = or_(RolloutWork.state == FAILED, RolloutWork.retry_at.is_not(None))

    def joined(*columns: Any) -> Any:
        return (
            select(*columns)
            .join(Trajectory, Trajectory.id == RolloutWork.trajectory_id)
            .join(Problem, Problem.id == Trajectory.problem_id)
            .where(troubled)
        )

    failed = RolloutWork.state == FAILED
    counts = session.execute(
        joined(Problem.problem_set_id, failed, func.count()).group_by(Problem.problem_set_id, failed)
    )
    for sid, is_failed, n in counts:
        entry = out.setdefault(sid, {"failed": 0, "retrying": 0, "last_error": None})
        entry["failed" if is_failed else "retrying"] += int(n)
    for sid in out:
        out[sid]["last_error"] = session.scalar(
            joined(RolloutWork.last_error)
            .where(Problem.problem_set_id == sid, RolloutWork.last_error.is_not(None))
            .order_by(RolloutWork.id.desc())
            .limit(1)
        )
    return out
