"""Rollouts, Q-values and labels: what a task reads and writes for one trajectory.

Part of ``stepq.models.queries`` (import them from there); the same rules hold: no SQL
outside ``models``, idempotent writes, conditional updates for ownership.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, aliased

from stepq.models.errors import NotFoundError
from stepq.models.problems import Problem, ProblemSet
from stepq.models.rollouts import ChunkLabel, QValue, Rollout
from stepq.models.set_queries import trajectory_chunks
from stepq.models.sql import upsert
from stepq.models.trajectories import Chunk, Trajectory

# --- rollouts, Q-values, labels --------------------------------------------------------


@dataclass(frozen=True)
class WorkContext:
    """Everything a task needs to know about one trajectory, read in one go."""

    trajectory: Trajectory
    problem: Problem
    problem_set: ProblemSet
    chunks: list[Chunk]
    rewards: dict[int, dict[int, int]]
    generator: str | None = None
    """Who drew the trajectory's stored rollouts (None: none yet)."""
    siblings: tuple[tuple[int, bool], ...] = ()
    """(chunks shared with this trajectory, outcome) of each other trajectory of the problem
    that the same policy drew from the same prompt, in id order: the outcome is a sample of
    every prefix the two share (``sibling_samples``)."""


def load_work_context(session: Session, trajectory_id: int) -> WorkContext:
    traj = session.get(Trajectory, trajectory_id)
    if traj is None:
        raise NotFoundError(f"trajectory {trajectory_id} does not exist")
    problem = session.get(Problem, traj.problem_id)
    assert problem is not None
    pset = session.get(ProblemSet, problem.problem_set_id)
    assert pset is not None
    generator = session.scalar(select(Rollout.generator).where(Rollout.trajectory_id == trajectory_id).limit(1))
    chunks = trajectory_chunks(session, trajectory_id)
    siblings = sibling_samples(session, {trajectory_id: chunks}).get(trajectory_id, ())
    return WorkContext(traj, problem, pset, chunks, rollout_rewards(session, traj.id), generator, siblings)


def sibling_samples(session: Session, chunks_of: dict[int, list[Chunk]]) -> dict[int, tuple[tuple[int, bool], ...]]:
    """For each trajectory (with its chunks), the other trajectories of its problem drawn by
    the same generator from the same prompt, with an outcome: how many leading chunks each
    shares with it, and its outcome, in id order.  A sibling that wrote the same first k
    chunks continued prefix k as a rollout would: its outcome is a sample of that prefix
    (of prefix 0, the prompt alone, always).  Two queries, whatever the number."""
    ids = list(chunks_of)
    if not ids:
        return {}
    me, sib = aliased(Trajectory), aliased(Trajectory)
    pairs = session.execute(
        select(me.id, sib.id, sib.outcome)
        .join(sib, (sib.problem_id == me.problem_id) & (sib.id != me.id))
        .where(me.id.in_(ids), sib.generator == me.generator, sib.prompt == me.prompt, sib.outcome.is_not(None))
        .order_by(me.id, sib.id)
    ).all()
    if not pairs:
        return {}
    texts: dict[int, list[str]] = {}
    sib_ids = sorted({s for _, s, _ in pairs})
    for tid, text_ in session.execute(
        select(Chunk.trajectory_id, Chunk.text)
        .where(Chunk.trajectory_id.in_(sib_ids))
        .order_by(Chunk.trajectory_id, Chunk.idx)
    ):
        texts.setdefault(tid, []).append(text_)
    out: dict[int, list[tuple[int, bool]]] = {}
    for tid, sid, outcome in pairs:
        mine, theirs = [c.text for c in chunks_of[tid]], texts.get(sid, [])
        shared = 0
        while shared < min(len(mine), len(theirs)) and mine[shared] == theirs[shared]:
            shared += 1
        out.setdefault(tid, []).append((shared, bool(outcome)))
    return {tid: tuple(v) for tid, v in out.items()}


def load_work_contexts(session: Session, trajectory_ids: Sequence[int]) -> dict[int, WorkContext]:
    """``load_work_context`` for several trajectories in seven queries, whatever their number
    (a task's message: the engine waits while they load)."""
    ids = list(dict.fromkeys(trajectory_ids))
    trajectories = {t.id: t for t in session.scalars(select(Trajectory).where(Trajectory.id.in_(ids)))}
    missing = [i for i in ids if i not in trajectories]
    if missing:
        raise NotFoundError(f"trajectories {missing} do not exist")
    problem_ids = {t.problem_id for t in trajectories.values()}
    problems = {p.id: p for p in session.scalars(select(Problem).where(Problem.id.in_(problem_ids)))}
    set_ids = {p.problem_set_id for p in problems.values()}
    sets = {p.id: p for p in session.scalars(select(ProblemSet).where(ProblemSet.id.in_(set_ids)))}
    chunks: dict[int, list[Chunk]] = {i: [] for i in ids}
    in_order = select(Chunk).where(Chunk.trajectory_id.in_(ids)).order_by(Chunk.trajectory_id, Chunk.idx)
    for chunk in session.scalars(in_order):
        chunks[chunk.trajectory_id].append(chunk)
    rewards: dict[int, dict[int, dict[int, int]]] = {i: {} for i in ids}
    generators: dict[int, str] = {}
    rows = session.execute(
        select(Rollout.trajectory_id, Rollout.prefix_len, Rollout.sample_idx, Rollout.reward, Rollout.generator).where(
            Rollout.trajectory_id.in_(ids)
        )
    )
    for tid, k, i, r, generator in rows:
        rewards[tid].setdefault(k, {})[i] = int(r)
        generators.setdefault(tid, generator)
    siblings = sibling_samples(session, chunks)
    out = {}
    for tid in ids:
        problem = problems[trajectories[tid].problem_id]
        out[tid] = WorkContext(
            trajectories[tid],
            problem,
            sets[problem.problem_set_id],
            chunks[tid],
            rewards[tid],
            generators.get(tid),
            siblings.get(tid, ()),
        )
    return out


def rollout_rewards(session: Session, trajectory_id: int) -> dict[int, dict[int, int]]:
    """prefix -> sample index -> reward, for every rollout of a trajectory."""
    out: dict[int, dict[int, int]] = {}
    rows = session.execute(
        select(Rollout.prefix_len, Rollout.sample_idx, Rollout.reward).where(Rollout.trajectory_id == trajectory_id)
    )
    for k, i, r in rows:
        out.setdefault(k, {})[i] = int(r)
    return out


def rollouts_to_regrade(
    session: Session,
    set_id: int,
    methods: Sequence[str] | None,
    *,
    after_id: int,
    limit: int,
    trajectory_ids: Sequence[int] | None = None,
) -> list[Any]:
    """(id, trajectory_id, text, final_answer, reward, grade_method, reference_answer) of a
    set's rollouts in id order after ``after_id``, optionally only those graded by ``methods``."""
    stmt = (
        select(
            Rollout.id,
            Rollout.trajectory_id,
            Rollout.text,
            Rollout.final_answer,
            Rollout.reward,
            Rollout.grade_method,
            Problem.reference_answer,
        )
        .join(Trajectory, Trajectory.id == Rollout.trajectory_id)
        .join(Problem, Problem.id == Trajectory.problem_id)
        .where(Problem.problem_set_id == set_id, Rollout.id > after_id)
        .order_by(Rollout.id)
        .limit(limit)
    )
    if methods is not None:
        stmt = stmt.where(Rollout.grade_method.in_(methods))
    if trajectory_ids is not None:
        stmt = stmt.where(Rollout.trajectory_id.in_(trajectory_ids))
    return list(session.execute(stmt))


def update_grades(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """New reward, method and answer for rollouts, by id (one executemany)."""
    if not rows:
        return
    from sqlalchemy import bindparam

    table = Rollout.__table__
    stmt = (
        update(table)  # type: ignore[arg-type]
        .where(table.c.id == bindparam("rid"))
        .values(reward=bindparam("new_reward"), grade_method=bindparam("method"), final_answer=bindparam("answer"))
    )
    session.connection().execute(
        stmt,
        [
            {"rid": r["id"], "new_reward": r["reward"], "method": r["grade_method"], "answer": r["final_answer"]}
            for r in rows
        ],
    )


def label_rules_of(session: Session, trajectory_ids: Sequence[int]) -> set[str]:
    """The rules these trajectories' chunks have labels under."""
    return set(
        session.scalars(
            select(ChunkLabel.rule)
            .join(Chunk, Chunk.id == ChunkLabel.chunk_id)
            .where(Chunk.trajectory_id.in_(trajectory_ids))
            .distinct()
        )
    )


def upsert_q_values(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    upsert(session, QValue, rows, ("trajectory_id", "prefix_len"), ("n_samples", "n_correct", "q", "source"))


def upsert_labels(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    upsert(session, ChunkLabel, rows, ("chunk_id", "rule"), ("positive", "q_before", "q_after"))
