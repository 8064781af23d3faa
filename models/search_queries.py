"""Step search's queries: create searches, write turns under the lease, and read their pairs.
A search is a job of the one queue (``jobs``, ``search.STEP_SEARCHES``): leasing, publishing
and recovering it is the queue's; every write here is idempotent."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from stepq.models.base import epoch
from stepq.models.errors import NotFoundError
from stepq.models.jobs import PENDING
from stepq.models.problems import Problem
from stepq.models.search import SearchTurn, StepSearch
from stepq.models.sql import _insert, insert_ignore
from stepq.models.trajectories import Chunk, Trajectory
from stepq.models.wakeup import announce


def create_searches(session: Session, rows: Sequence[dict[str, Any]]) -> int:
    """Insert searches that do not exist yet (unique per name and problem); returns how many
    were new.  Starting the same search again adds only new problems."""
    now = epoch()
    values = [{"state": PENDING, "attempts": 0, "updated_at": now, "judge_config": {}, **r} for r in rows]
    new = insert_ignore(session, StepSearch, values)
    if new:
        announce(session)
    return new


def problems_of_set(session: Session, set_id: int) -> list[tuple[int, str]]:
    rows = session.execute(
        select(Problem.id, Problem.question)
        .where(Problem.problem_set_id == set_id, Problem.excluded.is_(False))
        .order_by(Problem.id)
    )
    return [(int(i), str(q)) for i, q in rows]


def policy_prompts(session: Session, set_id: int) -> dict[int, str]:
    """Per problem, the prompt its first policy trajectory was sampled from (template and chat
    template applied): a search continues the policy's own context."""
    rows = session.execute(
        select(Trajectory.problem_id, Trajectory.prompt)
        .join(Problem, Problem.id == Trajectory.problem_id)
        .where(Problem.problem_set_id == set_id, Trajectory.source_key.like("policy:%"))
        .order_by(Trajectory.id.desc())
    )
    return {int(pid): str(prompt) for pid, prompt in rows}  # the lowest id last: it wins


def set_segmentation(session: Session, set_id: int) -> str | None:
    """The segmentation method most of the set's policy trajectories were cut with."""
    row = session.execute(
        select(Trajectory.segmentation, func.count())
        .join(Problem, Problem.id == Trajectory.problem_id)
        .where(Problem.problem_set_id == set_id, Trajectory.source_key.like("policy:%"))
        .group_by(Trajectory.segmentation)
        .order_by(func.count().desc(), Trajectory.segmentation)
        .limit(1)
    ).first()
    return None if row is None else str(row[0])


def segmented_samples(session: Session, set_id: int, method: str, limit: int = 50) -> list[list[str]]:
    """The chunks of up to ``limit`` of the set's policy trajectories cut with ``method``: what a
    splitter must give back to stand in for that method on new text."""
    ids = list(
        session.scalars(
            select(Trajectory.id)
            .join(Problem, Problem.id == Trajectory.problem_id)
            .where(
                Problem.problem_set_id == set_id,
                Trajectory.source_key.like("policy:%"),
                Trajectory.segmentation == method,
            )
            .order_by(Trajectory.id)
            .limit(limit)
        )
    )
    chunks: dict[int, list[str]] = {i: [] for i in ids}
    for tid, text in session.execute(
        select(Chunk.trajectory_id, Chunk.text)
        .where(Chunk.trajectory_id.in_(ids))
        .order_by(Chunk.trajectory_id, Chunk.idx)
    ):
        chunks[int(tid)].append(str(text))
    return [c for c in chunks.values() if c]


def search_turns(session: Session, search_id: int) -> list[SearchTurn]:
    return list(session.scalars(select(SearchTurn).where(SearchTurn.search_id == search_id).order_by(SearchTurn.turn)))


def record_turn(session: Session, search_id: int, turn: dict[str, Any]) -> None:
    """Write one turn (in the transaction that renews or ends the search's lease: the runner's
    fence, so a turn lands only while its writer holds the search)."""
    stmt = _insert(session, SearchTurn.__table__).on_conflict_do_nothing()
    session.connection().execute(stmt, [{"search_id": search_id, "created_at": epoch(), **turn}])


def search_progress(session: Session) -> list[dict[str, Any]]:
    """Per search name: searches by state, turns, pairs, order-consistent judgements and the
    judge's answers without a verdict."""
    states = session.execute(
        select(StepSearch.name, StepSearch.state, func.count()).group_by(StepSearch.name, StepSearch.state)
    ).all()
    turns = session.execute(
        select(
            StepSearch.name,
            func.count(SearchTurn.id),
            func.count(SearchTurn.chosen),
            func.coalesce(func.sum(SearchTurn.consistent_pairs), 0),
            func.coalesce(func.sum(SearchTurn.unanswered), 0),
        )
        .join(SearchTurn, SearchTurn.search_id == StepSearch.id)
        .group_by(StepSearch.name)
    ).all()
    runs = session.execute(
        select(StepSearch.name, StepSearch.policy_run_id).where(StepSearch.policy_run_id.is_not(None)).distinct()
    ).all()
    out: dict[str, dict[str, Any]] = {}
    for name, state, n in states:
        entry = {"search": name, "turns": 0, "pairs": 0, "consistent_pairs": 0, "unanswered": 0, "policy_runs": []}
        out.setdefault(name, entry)[state] = int(n)
    for name, run_id in runs:
        if run_id is not None:
            out[name]["policy_runs"].append(int(run_id))
    for name, n_turns, n_pairs, consistent, unanswered in turns:
        out[name].update(
            turns=int(n_turns), pairs=int(n_pairs), consistent_pairs=int(consistent), unanswered=int(unanswered)
        )
    return [out[k] for k in sorted(out)]


def search_turn_rows(session: Session, name: str) -> list[dict[str, Any]]:
    """Every turn of a search's problems, in (search, turn) order, with the texts a preference
    pair is made of (``chosen``/``rejected`` None on turns that kept nothing).  Which pairs
    survive the search's rollbacks is the method's rule (``step_search.surviving_pairs``)."""
    if not session.scalar(select(func.count()).select_from(StepSearch).where(StepSearch.name == name)):
        raise NotFoundError(f"no step search named '{name}' (see 'stepq search status')")
    rows = session.execute(
        select(StepSearch.id, StepSearch.prompt, Problem.question, Problem.external_id, SearchTurn)
        .join(SearchTurn, SearchTurn.search_id == StepSearch.id)
        .join(Problem, Problem.id == StepSearch.problem_id)
        .where(StepSearch.name == name)
        .order_by(StepSearch.id, SearchTurn.turn)
    ).all()
    return [
        {
            "search_id": sid,
            "question": question,
            "policy_prompt": policy_prompt,
            "problem_id": external_id,
            "turn": t.turn,
            "action": t.action,
            "prefix": list(t.prefix),
            "chosen": None if t.chosen is None else t.candidates[t.chosen],
            "rejected": None if t.rejected is None else t.candidates[t.rejected],
            "wins_chosen": None if t.chosen is None else t.wins[t.chosen],
            "wins_rejected": None if t.rejected is None else t.wins[t.rejected],
        }
        for sid, policy_prompt, question, external_id, t in rows
    ]
