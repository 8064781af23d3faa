"""Ordering a set's rollout work: priority rounds, their scoring jobs, and the priorities
they write.  Part of ``stepq.models.queries`` (import them from there).

A round's scoring jobs each cover a range of the set's rollout work ids; work planned after
the round began gets jobs of its own (``cover_new_work``, each dispatcher cycle), scored by the
same judge.  Priorities are written only on work still waiting (pending or queued), and never
over a later round's: the work that ran keeps the round that placed it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, func, or_, select, update
from sqlalchemy.orm import Session

from stepq.models import jobs
from stepq.models.base import epoch
from stepq.models.jobs import PENDING, QUEUED, RUNNING
from stepq.models.prioritization import PRIORITY_SCORINGS, PriorityRound, PriorityScoring
from stepq.models.problems import Problem, ProblemSet
from stepq.models.rollouts import Rollout
from stepq.models.trajectories import Chunk, Trajectory
from stepq.models.wakeup import announce
from stepq.models.work import RolloutWork

WAITING = (PENDING, QUEUED)


def _top_work_id(session: Session) -> int:
    return int(session.scalar(select(func.max(RolloutWork.id))) or 0)


def _waiting_ids(session: Session, set_id: int, after_id: int, upto_id: int) -> list[int]:
    """The set's waiting work in ``after_id < id <= upto_id`` (read after ``upto_id``, so work
    committed in between is left to the next cover, not claimed covered and missed)."""
    in_range = and_(RolloutWork.id > after_id, RolloutWork.id <= upto_id)
    return list(
        session.scalars(
            select(RolloutWork.id)
            .where(in_range, RolloutWork.problem_set_id == set_id, RolloutWork.state.in_(WAITING))
            .order_by(RolloutWork.id)
        )
    )


def _add_scoring_jobs(session: Session, round_: PriorityRound, ids: Sequence[int], batch: int, now: float) -> int:
    """One scoring job per ``batch`` consecutive waiting ids; returns how many jobs."""
    bounds = [round_.covered_to_id]
    bounds += [ids[min(i + batch, len(ids)) - 1] for i in range(0, len(ids), batch)]
    for lo, hi in itertools.pairwise(bounds):
        session.add(
            PriorityScoring(
                round_id=round_.id,
                problem_set_id=round_.problem_set_id,
                work_from_id=lo,
                work_to_id=hi,
                state=PENDING,
                attempts=0,
                enqueue_count=0,
                updated_at=now,
            )
        )
    return len(bounds) - 1


def start_round(
    session: Session,
    set_id: int,
    strategy: str,
    judge_run_id: int | None,
    labelled_before: int,
    batch: int,
    details: dict[str, Any] | None = None,
) -> tuple[int, int]:
    """A new ordering of a set's waiting work: the round's row and its scoring jobs.
    Returns (round id, scoring jobs)."""
    now = epoch()
    spent = session.scalar(
        select(func.count(Rollout.id))
        .join(Trajectory, Trajectory.id == Rollout.trajectory_id)
        .join(Problem, Problem.id == Trajectory.problem_id)
        .where(Problem.problem_set_id == set_id)
    )
    round_ = PriorityRound(
        problem_set_id=set_id,
        strategy=strategy,
        judge_run_id=judge_run_id,
        created_at=now,
        rollouts_before=int(spent or 0),
        labelled_before=labelled_before,
        covered_to_id=0,
        details=details or {},
    )
    session.add(round_)
    session.flush()
    top = _top_work_id(session)
    n_jobs = _add_scoring_jobs(session, round_, _waiting_ids(session, set_id, 0, top), batch, now)
    round_.covered_to_id = top
    announce(session)
    return round_.id, n_jobs


def latest_round(session: Session, set_id: int) -> PriorityRound | None:
    return session.scalar(
        select(PriorityRound).where(PriorityRound.problem_set_id == set_id).order_by(PriorityRound.id.desc()).limit(1)
    )


def cover_new_work(session: Session, batch: int) -> int:
    """Scoring jobs for work planned since each prioritised set's latest round began (new
    problems, new trajectories); returns how many jobs were added.  One read of the table's
    largest id when nothing is new."""
    top = _top_work_id(session)
    added = 0
    now = epoch()
    prioritised = select(ProblemSet.id).where(ProblemSet.priority_strategy != "fifo")
    for set_id in session.scalars(prioritised):
        round_ = latest_round(session, set_id)
        if round_ is None or round_.covered_to_id >= top:
            continue
        waiting = _waiting_ids(session, set_id, round_.covered_to_id, top)
        added += _add_scoring_jobs(session, round_, waiting, batch, now)
        round_.covered_to_id = top
    return added


@dataclass(frozen=True)
class WaitingTrajectory:
    work_id: int
    trajectory_id: int
    planned_at: float
    question: str
    chunks: tuple[str, ...]
    outcome: bool | None


def waiting_in_range(session: Session, set_id: int, after_id: int, to_id: int) -> list[WaitingTrajectory]:
    """The set's waiting work in ``after_id < id <= to_id``, with what a judge reads."""
    rows = session.execute(
        select(RolloutWork.id, Trajectory.id, RolloutWork.planned_at, Problem.question, Trajectory.outcome)
        .join(Trajectory, Trajectory.id == RolloutWork.trajectory_id)
        .join(Problem, Problem.id == Trajectory.problem_id)
        .where(
            RolloutWork.id > after_id,
            RolloutWork.id <= to_id,
            RolloutWork.problem_set_id == set_id,
            RolloutWork.state.in_(WAITING),
        )
        .order_by(RolloutWork.id)
    ).all()
    chunks: dict[int, list[str]] = {}
    if rows:
        for tid, text in session.execute(
            select(Chunk.trajectory_id, Chunk.text)
            .where(Chunk.trajectory_id.in_([r[1] for r in rows]))
            .order_by(Chunk.trajectory_id, Chunk.idx)
        ):
            chunks.setdefault(tid, []).append(text)
    return [
        WaitingTrajectory(wid, tid, float(planned), question, tuple(chunks.get(tid, ())), outcome)
        for wid, tid, planned, question, outcome in rows
    ]


def write_priorities(session: Session, round_id: int, rows: Sequence[tuple[int, float, float]]) -> int:
    """(work id, priority, dispatch key) for waiting work not placed by a later round;
    returns how many were written."""
    if not rows:
        return 0
    t = RolloutWork.__table__  # type: ignore[attr-defined]
    stmt = (
        update(t)  # type: ignore[arg-type]
        .where(
            t.c.id == bindparam("wid"),
            or_(t.c.state == PENDING, t.c.state == QUEUED),  # no IN: an executemany cannot expand it
            or_(t.c.priority_round_id.is_(None), t.c.priority_round_id <= round_id),
        )
        .values(priority=bindparam("p"), dispatch_key=bindparam("k"), priority_round_id=round_id)
    )
    result = session.connection().execute(stmt, [{"wid": w, "p": p, "k": k} for w, p, k in rows])
    return int(result.rowcount or 0)


def reset_priorities(session: Session, set_id: int) -> int:
    """Back to plan order (``fifo``): the set's waiting work loses its priorities."""
    result = session.execute(
        update(RolloutWork)
        .where(RolloutWork.problem_set_id == set_id, RolloutWork.state.in_(WAITING))
        .values(priority=0.0, dispatch_key=RolloutWork.planned_at, priority_round_id=None)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def round_progress(session: Session, round_id: int) -> dict[str, int]:
    """The round's scoring jobs per state."""
    counts = session.execute(
        select(PriorityScoring.state, func.count())
        .where(PriorityScoring.round_id == round_id)
        .group_by(PriorityScoring.state)
    )
    return {state: int(n) for state, n in counts}


def prioritised_sets(session: Session) -> list[ProblemSet]:
    """Sets whose work a strategy other than ``fifo`` orders."""
    return list(
        session.scalars(select(ProblemSet).where(ProblemSet.priority_strategy != "fifo").order_by(ProblemSet.id))
    )


def sets_being_scored(session: Session) -> set[int]:
    """Sets with scoring jobs not yet settled: their rollout work waits for its new order
    (a failed scoring job does not hold the set back; it shows in the set's troubles)."""
    unsettled = PriorityScoring.state.in_([PENDING, QUEUED, RUNNING])
    return set(session.scalars(select(PriorityScoring.problem_set_id).where(unsettled).distinct()))


def priority_summary(session: Session) -> dict[int, dict[str, Any]]:
    """set id -> its strategy, latest round, the judge behind it and the round's scoring jobs
    per state, for every prioritised set (a few rows per set: cheap on any scale)."""
    out: dict[int, dict[str, Any]] = {}
    for pset in prioritised_sets(session):
        round_ = latest_round(session, pset.id)
        out[pset.id] = {
            "strategy": pset.priority_strategy,
            "round": round_.id if round_ else None,
            "judge_run_id": round_.judge_run_id if round_ else None,
            "scoring": round_progress(session, round_.id) if round_ else {},
            "last_error": jobs.failed_in_set(session, PRIORITY_SCORINGS, pset.id)[1],
        }
    return out
