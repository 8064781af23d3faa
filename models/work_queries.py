"""Rollout work beyond the queue's common lifecycle: planning a set's work for its current M,
reopening work when a set's settings change, and what the budget records per item.

The lifecycle itself (publish, claim, renew, finish, fail or retry, recover) is the job
queue's, written once for every kind of work in ``jobs``, with ``work.ROLLOUT_WORK`` naming
this table.  Part of ``stepq.models.queries`` (import them from there).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import and_, func, select, update
from sqlalchemy.orm import Session

from stepq.models.base import epoch
from stepq.models.counters import SetCounters
from stepq.models.jobs import DONE, FAILED, PENDING, QUEUED, RUNNING
from stepq.models.problems import Problem, ProblemSet
from stepq.models.sql import insert_ignore
from stepq.models.trajectories import Trajectory
from stepq.models.wakeup import announce
from stepq.models.work import RolloutWork

# --- planning -------------------------------------------------------------------------


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
        now = epoch()
        rows = [
            {
                "trajectory_id": tid,
                "problem_set_id": sid,
                "target_m": m,
                "state": PENDING,
                "attempts": 0,
                "enqueue_count": 0,
                "planned_at": now,
                "dispatch_key": now,
            }
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
    if changed and set_id is not None:  # a person planned a set (the dispatcher plans them all)
        announce(session)
    return changed


def reopen_set(session: Session, set_id: int) -> int:
    """Items of a set run again, e.g. after its rule or budget changed: done items go back
    to pending, running ones are marked to go back when their task ends (their task read
    the old settings).  The task works out from the rollouts what is still missing."""
    in_set = RolloutWork.problem_set_id == set_id
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
    announce(session)
    return int(result.rowcount or 0) + int(running.rowcount or 0)  # type: ignore[attr-defined]


def reopen_trajectories(session: Session, trajectory_ids: Sequence[int]) -> int:
    """These trajectories' items run again (done -> pending; running ones when they end)."""
    in_ids = RolloutWork.trajectory_id.in_(trajectory_ids)
    session.execute(update(RolloutWork).where(in_ids, RolloutWork.state == RUNNING).values(rerun=True))
    result = session.execute(
        update(RolloutWork).where(in_ids, RolloutWork.state == DONE).values(state=PENDING, attempts=0)
    )
    announce(session)
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def work_trajectories(session: Session, work_ids: Sequence[int]) -> dict[int, int]:
    """Work item id -> its trajectory's id."""
    if not work_ids:
        return {}
    rows = session.execute(select(RolloutWork.id, RolloutWork.trajectory_id).where(RolloutWork.id.in_(list(work_ids))))
    return {int(w): int(t) for w, t in rows}


def mark_trajectory_counted(session: Session, trajectory_id: int, counted: bool) -> None:
    session.execute(
        update(RolloutWork).where(RolloutWork.trajectory_id == trajectory_id).values(trajectory_is_sample=counted)
    )


def trajectory_counted(session: Session, trajectory_id: int) -> bool:
    """Whether the budget counted the trajectory itself as a sample (recorded by its task)."""
    value = session.scalar(select(RolloutWork.trajectory_is_sample).where(RolloutWork.trajectory_id == trajectory_id))
    return bool(value)


def work_counts(session: Session) -> dict[str, int]:
    """Work items per state over every set (from the counters on PostgreSQL)."""
    if session.get_bind().dialect.name == "postgresql":
        states = ("pending", "queued", "running", "done", "failed")
        row = session.execute(select(*(func.sum(getattr(SetCounters, f"work_{st}")) for st in states))).one()
        return {st: int(n) for st, n in zip(states, row, strict=True) if n}
    rows = session.execute(select(RolloutWork.state, func.count()).group_by(RolloutWork.state))
    return {state: int(n) for state, n in rows}
