"""Step search's queries: create searches, lease them, write turns under the lease, publish
and recover them, and read their pairs.  The same rules as the rollout queue: the broker
carries ids only, every write is idempotent, ownership is a conditional update."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import case, func, or_, select, update
from sqlalchemy.orm import Session

from stepq.models.base import epoch
from stepq.models.errors import NotFoundError
from stepq.models.problems import Problem
from stepq.models.search import SearchTurn, StepSearch
from stepq.models.sql import _insert, insert_ignore
from stepq.models.work import DONE, FAILED, PENDING, QUEUED, RUNNING


def create_searches(session: Session, rows: Sequence[dict[str, Any]]) -> int:
    """Insert searches that do not exist yet (unique per name and problem); returns how many
    were new.  Starting the same search again adds only new problems."""
    now = epoch()
    values = [{"state": PENDING, "attempts": 0, "updated_at": now, "judge_config": {}, **r} for r in rows]
    return insert_ignore(session, StepSearch, values)


def problems_of_set(session: Session, set_id: int) -> list[tuple[int, str]]:
    rows = session.execute(
        select(Problem.id, Problem.question)
        .where(Problem.problem_set_id == set_id, Problem.excluded.is_(False))
        .order_by(Problem.id)
    )
    return [(int(i), str(q)) for i, q in rows]


def claim_search(session: Session, search_id: int, owner: str, ttl: float) -> StepSearch | None:
    """Take the search's lease when it is queued, pending, or its holder's lease ran out."""
    now = epoch()
    result = session.execute(
        update(StepSearch)
        .where(
            StepSearch.id == search_id,
            or_(
                StepSearch.state.in_([PENDING, QUEUED]),
                (StepSearch.state == RUNNING) & (StepSearch.lease_expires_at < now),
            ),
        )
        .values(
            state=RUNNING,
            lease_owner=owner,
            lease_expires_at=now + ttl,
            attempts=StepSearch.attempts + 1,
            updated_at=now,
        )
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        return None
    return session.get(StepSearch, search_id)


def search_turns(session: Session, search_id: int) -> list[SearchTurn]:
    return list(session.scalars(select(SearchTurn).where(SearchTurn.search_id == search_id).order_by(SearchTurn.turn)))


def record_turn(
    session: Session, search_id: int, owner: str, ttl: float, turn: dict[str, Any], outcome: str | None
) -> bool:
    """Write one turn and renew the lease, only while ``owner`` holds it; ``outcome`` ends the
    search.  False when the lease was lost (another worker has the search now)."""
    now = epoch()
    values: dict[str, Any] = {"lease_expires_at": now + ttl, "updated_at": now}
    if outcome is not None:
        values.update(state=DONE, outcome=outcome, lease_owner=None, lease_expires_at=None)
    held = session.execute(
        update(StepSearch)
        .where(StepSearch.id == search_id, StepSearch.lease_owner == owner, StepSearch.state == RUNNING)
        .values(**values)
    )
    if not held.rowcount:  # type: ignore[attr-defined]
        return False
    stmt = _insert(session, SearchTurn.__table__).on_conflict_do_nothing()
    session.connection().execute(stmt, [{"search_id": search_id, "created_at": now, **turn}])
    return True


def renew_owner_searches(session: Session, owner: str, ttl: float, ids: Sequence[int]) -> int:
    """Extend the leases on the searches ``ids`` (those a task runs now) that this process
    holds: its heartbeat, so one turn longer than the lease does not lose the search."""
    if not ids:
        return 0
    now = epoch()
    result = session.execute(
        update(StepSearch)
        .where(StepSearch.id.in_(list(ids)), StepSearch.lease_owner == owner, StepSearch.state == RUNNING)
        .values(lease_expires_at=now + ttl, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def release_search(
    session: Session, search_id: int, owner: str, *, error: str | None, permanent: bool, max_attempts: int
) -> None:
    """After a failure, if still ours: fail the search for good (a permanent error, or its
    ``max_attempts``-th attempt) or hand it back to be published again."""
    state: Any = FAILED if permanent else case((StepSearch.attempts >= max_attempts, FAILED), else_=PENDING)
    _release(session, search_id, owner, state=state, error=error)


def hand_back_search(session: Session, search_id: int, owner: str) -> None:
    """A stopping worker gives the search back unharmed: the attempt does not count."""
    _release(session, search_id, owner, state=PENDING, attempts=StepSearch.attempts - 1)


def _release(session: Session, search_id: int, owner: str, **values: Any) -> None:
    session.execute(
        update(StepSearch)
        .where(StepSearch.id == search_id, StepSearch.lease_owner == owner)
        .values(lease_owner=None, lease_expires_at=None, enqueued_at=None, updated_at=epoch(), **values)
    )


def recover_searches(session: Session, now: float, lost_before: float | None, max_attempts: int) -> int:
    """Searches whose worker died (lease ran out) go back to pending, or fail after
    ``max_attempts``; with ``lost_before``, queued ones published before it whose message is
    gone (the broker's queue is empty) too.  Returns how many were reset."""
    expired = (StepSearch.state == RUNNING) & (StepSearch.lease_expires_at < now)
    session.execute(
        update(StepSearch)
        .where(expired, StepSearch.attempts >= max_attempts)
        .values(state=FAILED, error="lease expired too many times", lease_owner=None, updated_at=now)
    )
    reset = session.execute(
        update(StepSearch)
        .where(expired)
        .values(state=PENDING, lease_owner=None, lease_expires_at=None, enqueued_at=None, updated_at=now)
    ).rowcount  # type: ignore[attr-defined]
    if lost_before is not None:
        reset += session.execute(
            update(StepSearch)
            .where(StepSearch.state == QUEUED, StepSearch.enqueued_at < lost_before)
            .values(state=PENDING, enqueued_at=None, updated_at=now)
        ).rowcount  # type: ignore[attr-defined]
    return int(reset or 0)


def queued_search_count(session: Session) -> int:
    """Searches marked queued: each one a broker message (waiting, or reserved by a worker
    that has not claimed it yet), counted against the broker's one bound."""
    return int(session.scalar(select(func.count()).select_from(StepSearch).where(StepSearch.state == QUEUED)) or 0)


def queue_pending_searches(session: Session, limit: int) -> list[int]:
    """Mark up to ``limit`` pending searches queued (their ids are then published)."""
    ids = list(
        session.scalars(
            select(StepSearch.id)
            .where(StepSearch.state == PENDING)
            .order_by(StepSearch.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    )
    if ids:
        now = epoch()
        session.execute(
            update(StepSearch).where(StepSearch.id.in_(ids)).values(state=QUEUED, enqueued_at=now, updated_at=now)
        )
    return ids


def unqueue_searches(session: Session, ids: Sequence[int]) -> None:
    session.execute(
        update(StepSearch)
        .where(StepSearch.id.in_(list(ids)), StepSearch.state == QUEUED)
        .values(state=PENDING, enqueued_at=None)
    )


def search_progress(session: Session) -> list[dict[str, Any]]:
    """Per search name: searches by state, turns, pairs and order-consistent judgements."""
    states = session.execute(
        select(StepSearch.name, StepSearch.state, func.count()).group_by(StepSearch.name, StepSearch.state)
    ).all()
    turns = session.execute(
        select(
            StepSearch.name,
            func.count(SearchTurn.id),
            func.count(SearchTurn.chosen),
            func.coalesce(func.sum(SearchTurn.consistent_pairs), 0),
        )
        .join(SearchTurn, SearchTurn.search_id == StepSearch.id)
        .group_by(StepSearch.name)
    ).all()
    runs = session.execute(
        select(StepSearch.name, StepSearch.policy_run_id).where(StepSearch.policy_run_id.is_not(None)).distinct()
    ).all()
    out: dict[str, dict[str, Any]] = {}
    for name, state, n in states:
        entry = {"search": name, "turns": 0, "pairs": 0, "consistent_pairs": 0, "policy_runs": []}
        out.setdefault(name, entry)[state] = int(n)
    for name, run_id in runs:
        if run_id is not None:
            out[name]["policy_runs"].append(int(run_id))
    for name, n_turns, n_pairs, consistent in turns:
        out[name].update(turns=int(n_turns), pairs=int(n_pairs), consistent_pairs=int(consistent))
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
