"""Every query the system runs against its tables, in one place.

Tasks, the dispatcher and the CLI call these; none of them builds SQL of its own.  All
writes are idempotent: inserts ignore conflicts on the natural unique keys, and state
changes are conditional updates whose row count says whether this process won.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, delete, func, or_, select, text, update
from sqlalchemy.orm import Session

from stepq.models.base import epoch
from stepq.models.counters import EventCount, LabelCounters, ProgressSample, SetCounters
from stepq.models.errors import NotFoundError
from stepq.models.problems import Problem, ProblemSet
from stepq.models.rollouts import ChunkLabel, QValue, Rollout
from stepq.models.trajectories import Chunk, Trajectory
from stepq.models.work import DONE, FAILED, PENDING, QUEUED, RUNNING, Lock, RolloutWork, Worker

MAX_BACKOFF_S = 600.0
"""The longest a transiently failing item waits before it is published again."""


def _insert(session: Session, model: Any) -> Any:
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(model)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(model)


def insert_ignore(session: Session, model: Any, rows: Sequence[dict[str, Any]]) -> int:
    """Insert rows, skipping those that hit a unique key; returns how many were new."""
    if not rows:
        return 0
    # Core executemany compiles once and batches rows into multi-VALUES statements; RETURNING
    # (not rowcount, on which drivers disagree) counts the rows that were new.
    table = model.__table__
    stmt = _insert(session, table).on_conflict_do_nothing().returning(*table.primary_key.columns)
    return len(session.connection().execute(stmt, list(rows)).all())


# --- problem sets -------------------------------------------------------------------


def pause_set(session: Session, name: str, paused: bool) -> bool:
    """Pause or resume a set; returns whether it changed.  A paused set's pending items are
    not published and its queued ones are not claimed; running ones finish their batch."""
    pset = get_set(session, name)
    changed = pset.paused != paused
    pset.paused = paused
    return changed


def delete_set(session: Session, name: str) -> dict[str, int]:
    """Remove a set and everything annotated on it; refuses while snapshots hold its chunks."""
    from stepq.models.errors import ConfigError
    from stepq.models.snapshots import SnapshotRow

    pset = get_set(session, name)
    held = session.scalar(
        select(func.count())
        .select_from(SnapshotRow)
        .join(Chunk, Chunk.id == SnapshotRow.chunk_id)
        .where(Chunk.trajectory_id.in_(_set_trajectories(pset.id)))
    )
    if held:
        raise ConfigError(
            f"set '{name}' has {held} chunks in snapshots, which are immutable: delete those snapshots first"
        )
    counts = {r["problem_set"]: r for r in progress(session)}.get(name, {})
    session.execute(delete(ProblemSet).where(ProblemSet.id == pset.id))  # cascades to everything below it
    for model in (SetCounters, LabelCounters, ProgressSample):
        session.execute(delete(model).where(model.problem_set_id == pset.id))
    return {k: int(counts.get(k) or 0) for k in ("problems", "trajectories", "rollouts_done")}


def count_event(session: Session, name: str, n: int = 1) -> None:
    """Add ``n`` to a running total (lease expiries, failures, lost messages, retries)."""
    if n:
        stmt = _insert(session, EventCount.__table__).values(name=name, value=n)
        session.execute(
            stmt.on_conflict_do_update(
                index_elements=["name"], set_={"value": EventCount.__table__.c.value + stmt.excluded.value}
            )
        )


def event_counts(session: Session) -> dict[str, int]:
    return {name: int(v) for name, v in session.execute(select(EventCount.name, EventCount.value))}


def work_troubles(session: Session) -> dict[int, dict[str, Any]]:
    """set id -> failed items, items backing off after a transient error, and the latest
    error; reads only failed and backing-off items (indexes on state and retry_at)."""
    out: dict[int, dict[str, Any]] = {}
    troubled = or_(RolloutWork.state == FAILED, RolloutWork.retry_at.is_not(None))
    rows = session.execute(
        select(Problem.problem_set_id, RolloutWork.id, RolloutWork.state, RolloutWork.last_error)
        .join(Trajectory, Trajectory.id == RolloutWork.trajectory_id)
        .join(Problem, Problem.id == Trajectory.problem_id)
        .where(troubled)
        .order_by(RolloutWork.id)
    )
    for sid, _, state, error in rows:
        entry = out.setdefault(sid, {"failed": 0, "retrying": 0, "last_error": None})
        entry["failed" if state == FAILED else "retrying"] += 1
        if error:
            entry["last_error"] = error
    return out


def lock_holder(session: Session, name: str) -> str | None:
    """Who holds a named lease now (None: nobody, or it expired)."""
    return session.scalar(select(Lock.owner).where(Lock.name == name, Lock.expires_at >= epoch()))


def get_set(session: Session, name: str) -> ProblemSet:
    found = session.scalar(select(ProblemSet).where(ProblemSet.name == name))
    if found is None:
        raise NotFoundError(f"no problem set named '{name}' (see 'stepq status')")
    return found


def ensure_set(session: Session, name: str, **config: Any) -> ProblemSet:
    """Return the set, creating it with ``config`` when it does not exist yet."""
    insert_ignore(session, ProblemSet, [{"name": name, "backend_config": {}, "sampling": {}, **config}])
    return get_set(session, name)


def existing_problem_ids(session: Session, set_id: int, external_ids: Iterable[str]) -> dict[str, int]:
    ids = list(external_ids)
    found: dict[str, int] = {}
    for start in range(0, len(ids), 500):
        part = ids[start : start + 500]
        rows = session.execute(
            select(Problem.external_id, Problem.id).where(
                Problem.problem_set_id == set_id, Problem.external_id.in_(part)
            )
        )
        found.update({ext: pid for ext, pid in rows})
    return found


def problem_contents(session: Session, set_id: int, external_ids: Iterable[str]) -> dict[str, tuple[str, str]]:
    """external id -> (question, reference answer) of stored problems."""
    ids = list(external_ids)
    found: dict[str, tuple[str, str]] = {}
    for start in range(0, len(ids), 500):
        rows = session.execute(
            select(Problem.external_id, Problem.question, Problem.reference_answer).where(
                Problem.problem_set_id == set_id, Problem.external_id.in_(ids[start : start + 500])
            )
        )
        found.update({ext: (q, a) for ext, q, a in rows})
    return found


def update_problems(session: Session, rows: Sequence[tuple[int, str, str, dict[str, Any]]]) -> None:
    """New (question, reference answer, meta) for problems, by id."""
    for pid, question, answer, meta in rows:
        session.execute(
            update(Problem).where(Problem.id == pid).values(question=question, reference_answer=answer, meta=meta)
        )


def trajectory_ids_of(session: Session, problem_ids: Sequence[int]) -> list[int]:
    if not problem_ids:
        return []
    return list(session.scalars(select(Trajectory.id).where(Trajectory.problem_id.in_(problem_ids))))


def delete_trajectories_of(session: Session, problem_ids: Sequence[int]) -> int:
    """Drop these problems' trajectories with everything annotated on them (cascades)."""
    tids = trajectory_ids_of(session, problem_ids)
    if not tids:
        return 0
    from stepq.models.snapshots import SnapshotRow

    in_snapshots = session.scalar(
        select(func.count())
        .select_from(SnapshotRow)
        .join(Chunk, Chunk.id == SnapshotRow.chunk_id)
        .where(Chunk.trajectory_id.in_(tids))
    )
    if in_snapshots:
        from stepq.models.errors import ConfigError

        raise ConfigError(
            f"{in_snapshots} rows of existing snapshots hold these problems' chunks: a snapshot is immutable, "
            "so their questions cannot change (ingest the new version under another id)"
        )
    chunk_ids = select(Chunk.id).where(Chunk.trajectory_id.in_(tids))
    session.execute(delete(ChunkLabel).where(ChunkLabel.chunk_id.in_(chunk_ids)))
    session.execute(delete(QValue).where(QValue.trajectory_id.in_(tids)))
    session.execute(delete(Rollout).where(Rollout.trajectory_id.in_(tids)))
    session.execute(delete(RolloutWork).where(RolloutWork.trajectory_id.in_(tids)))
    session.execute(delete(Chunk).where(Chunk.trajectory_id.in_(tids)))
    result = session.execute(delete(Trajectory).where(Trajectory.id.in_(tids)))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def regrade_outcomes(session: Session, trajectory_ids: Sequence[int], is_right: Any) -> None:
    """Trajectory outcomes graded again against their problem's (new) reference."""
    rows = session.execute(
        select(Trajectory.id, Trajectory.text, Problem.reference_answer)
        .join(Problem, Problem.id == Trajectory.problem_id)
        .where(Trajectory.id.in_(trajectory_ids))
    )
    for tid, body, reference in rows.all():
        session.execute(update(Trajectory).where(Trajectory.id == tid).values(outcome=is_right(body, reference)))


def problems_without_reference(session: Session, set_id: int) -> int:
    return int(
        session.scalar(
            select(func.count(Problem.id)).where(
                Problem.problem_set_id == set_id, Problem.reference_answer == "", Problem.excluded.is_(False)
            )
        )
        or 0
    )


def add_trajectory(session: Session, traj: dict[str, Any], chunks: Sequence[dict[str, Any]]) -> int | None:
    """Insert a trajectory and its chunks unless (problem, source_key) exists; returns its id."""
    new = insert_ignore(session, Trajectory, [traj])
    if not new:
        return None
    flag_for_planning(session, select(Problem.problem_set_id).where(Problem.id == traj["problem_id"]).scalar_subquery())
    tid = session.scalar(
        select(Trajectory.id).where(
            Trajectory.problem_id == traj["problem_id"], Trajectory.source_key == traj["source_key"]
        )
    )
    assert tid is not None
    insert_ignore(session, Chunk, [{**c, "trajectory_id": tid} for c in chunks])
    return tid


def trajectory_chunks(session: Session, trajectory_id: int) -> list[Chunk]:
    return list(session.scalars(select(Chunk).where(Chunk.trajectory_id == trajectory_id).order_by(Chunk.idx)))


def set_problems(session: Session, set_id: int, limit: int | None = None) -> list[Any]:
    """(id, external_id, question, reference_answer) of a set's problems, in id order."""
    return list(
        session.execute(
            select(Problem.id, Problem.external_id, Problem.question, Problem.reference_answer)
            .where(Problem.problem_set_id == set_id)
            .order_by(Problem.id)
            .limit(limit)
        )
    )


def trajectory_keys(session: Session, set_id: int) -> dict[int, set[str]]:
    """problem id -> source keys of its trajectories (what policy sampling already did)."""
    out: dict[int, set[str]] = {}
    for pid, key in session.execute(
        select(Trajectory.problem_id, Trajectory.source_key)
        .join(Problem, Problem.id == Trajectory.problem_id)
        .where(Problem.problem_set_id == set_id)
    ):
        out.setdefault(pid, set()).add(key)
    return out


def policy_outcomes(session: Session, set_id: int) -> dict[int, list[bool]]:
    """problem id -> outcomes of its policy-sampled trajectories."""
    out: dict[int, list[bool]] = {}
    for pid, outcome in session.execute(
        select(Trajectory.problem_id, Trajectory.outcome)
        .join(Problem, Problem.id == Trajectory.problem_id)
        .where(Problem.problem_set_id == set_id, Trajectory.source_key.like("policy:%"))
    ):
        out.setdefault(pid, []).append(bool(outcome))
    return out


def flag_for_planning(session: Session, set_id: Any) -> None:
    """The set has trajectories the dispatcher has not planned work for yet."""
    session.execute(
        update(ProblemSet)
        .where(ProblemSet.id == set_id, ProblemSet.needs_planning.is_(False))
        .values(needs_planning=True)
    )


def set_excluded(session: Session, set_id: int, problem_ids: Sequence[int]) -> None:
    """Exactly ``problem_ids`` of the set are excluded from annotation."""
    flag_for_planning(session, set_id)
    session.execute(update(Problem).where(Problem.problem_set_id == set_id).values(excluded=False))
    if problem_ids:
        session.execute(update(Problem).where(Problem.id.in_(problem_ids)).values(excluded=True))


def unannotated_trajectories(session: Session, set_id: int) -> tuple[list[tuple[int, str]], int]:
    """(id, text) of the set's trajectories never planned for annotation (no work item, no
    rollouts), and how many were."""
    has_rollouts = or_(
        select(RolloutWork.id).where(RolloutWork.trajectory_id == Trajectory.id).exists(),
        select(Rollout.id).where(Rollout.trajectory_id == Trajectory.id).exists(),
    )
    in_set = select(Trajectory.id, Trajectory.text).join(Problem, Problem.id == Trajectory.problem_id)
    in_set = in_set.where(Problem.problem_set_id == set_id)
    todo = [(int(t), str(x)) for t, x in session.execute(in_set.where(~has_rollouts).order_by(Trajectory.id))]
    annotated = session.scalar(select(func.count()).select_from(in_set.where(has_rollouts).subquery()))
    return todo, int(annotated or 0)


def replace_chunks(session: Session, trajectory_id: int, chunks: Sequence[str], method: str) -> None:
    """Cut a trajectory anew (only safe while it has no rollouts)."""
    session.execute(delete(Chunk).where(Chunk.trajectory_id == trajectory_id))
    session.execute(
        update(Trajectory).where(Trajectory.id == trajectory_id).values(n_chunks=len(chunks), segmentation=method)
    )
    insert_ignore(
        session,
        Chunk,
        [{"trajectory_id": trajectory_id, "idx": i + 1, "text": c, "ground_truth": None} for i, c in enumerate(chunks)],
    )


def labels_with_truth(session: Session, set_id: int, rule: str) -> list[tuple[bool, bool]]:
    """(label, ground truth) for the set's labelled chunks whose truth is known."""
    rows = session.execute(
        select(ChunkLabel.positive, Chunk.ground_truth)
        .join(Chunk, Chunk.id == ChunkLabel.chunk_id)
        .where(
            ChunkLabel.rule == rule,
            Chunk.ground_truth.is_not(None),
            Chunk.trajectory_id.in_(_set_trajectories(set_id)),
        )
    )
    return [(bool(p), bool(g)) for p, g in rows]


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


def renew_owner_leases(session: Session, owner: str, ttl: float) -> int:
    """Extend every lease a worker process holds: its heartbeat, so one long ``generate``
    call does not lose the work."""
    result = session.execute(
        update(RolloutWork)
        .where(RolloutWork.lease_owner == owner, RolloutWork.state == RUNNING)
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


def _set_trajectories(set_id: int) -> Any:
    return (
        select(Trajectory.id).join(Problem, Problem.id == Trajectory.problem_id).where(Problem.problem_set_id == set_id)
    )


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


def load_work_context(session: Session, trajectory_id: int) -> WorkContext:
    traj = session.get(Trajectory, trajectory_id)
    if traj is None:
        raise NotFoundError(f"trajectory {trajectory_id} does not exist")
    problem = session.get(Problem, traj.problem_id)
    assert problem is not None
    pset = session.get(ProblemSet, problem.problem_set_id)
    assert pset is not None
    generator = session.scalar(select(Rollout.generator).where(Rollout.trajectory_id == trajectory_id).limit(1))
    return WorkContext(
        traj, problem, pset, trajectory_chunks(session, trajectory_id), rollout_rewards(session, traj.id), generator
    )


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
    if not rows:
        return
    stmt = _insert(session, QValue.__table__)
    stmt = stmt.on_conflict_do_update(
        index_elements=["trajectory_id", "prefix_len"],
        set_={k: stmt.excluded[k] for k in ("n_samples", "n_correct", "q", "source")},
    )
    session.connection().execute(stmt, list(rows))


def upsert_labels(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    stmt = _insert(session, ChunkLabel.__table__)
    stmt = stmt.on_conflict_do_update(
        index_elements=["chunk_id", "rule"],
        set_={k: stmt.excluded[k] for k in ("positive", "q_before", "q_after")},
    )
    session.connection().execute(stmt, list(rows))


def set_trajectory_ids(session: Session, set_id: int, limit: int | None = None) -> list[int]:
    return list(session.scalars(_set_trajectories(set_id).order_by(Trajectory.id).limit(limit)))


# --- locks and workers --------------------------------------------------------------


def acquire_lock(session: Session, name: str, owner: str, ttl: float) -> bool:
    """Take or renew a named lease; True when ``owner`` holds it afterwards."""
    now = epoch()
    insert_ignore(session, Lock, [{"name": name, "owner": owner, "expires_at": now + ttl}])
    session.execute(
        update(Lock)
        .where(Lock.name == name, or_(Lock.owner == owner, Lock.expires_at < now))
        .values(owner=owner, expires_at=now + ttl)
    )
    return session.scalar(select(Lock.owner).where(Lock.name == name)) == owner


def release_lock(session: Session, name: str, owner: str) -> None:
    session.execute(delete(Lock).where(Lock.name == name, Lock.owner == owner))


def heartbeat(
    session: Session,
    name: str,
    *,
    hostname: str,
    pid: int,
    backend: str,
    rollouts: int = 0,
    tokens: int = 0,
    busy_items: int | None = None,
    label: str = "",
    engine_s: float | None = None,
    grades: dict[str, int] | None = None,
) -> None:
    """Record that a worker is alive and what it has done, in one upsert (``rollouts`` and
    ``tokens`` are added; ``engine_s`` and ``grades`` are the process's running totals)."""
    now = epoch()
    stmt = _insert(session, Worker.__table__).values(
        name=name,
        hostname=hostname,
        pid=pid,
        backend=backend,
        label=label,
        last_heartbeat=now,
        rollouts_done=rollouts,
        tokens_done=tokens,
        busy_items=busy_items or 0,
        engine_s=engine_s or 0.0,
        grades=grades,
    )
    table = Worker.__table__.c
    updates: dict[str, Any] = {
        "last_heartbeat": stmt.excluded.last_heartbeat,
        "backend": stmt.excluded.backend,
        "stopped_at": None,
        "rollouts_done": table.rollouts_done + stmt.excluded.rollouts_done,
        "tokens_done": table.tokens_done + stmt.excluded.tokens_done,
    }
    if busy_items is not None:
        updates["busy_items"] = stmt.excluded.busy_items
    if engine_s is not None:
        updates["engine_s"] = stmt.excluded.engine_s
    if grades is not None:
        updates["grades"] = stmt.excluded.grades
    session.execute(stmt.on_conflict_do_update(index_elements=["name"], set_=updates))


def worker_stopped(session: Session, name: str) -> None:
    """A worker that exits cleanly says so: it stops counting as live at once."""
    session.execute(update(Worker).where(Worker.name == name).values(stopped_at=epoch(), busy_items=0))


def live_workers(session: Session, since: float) -> list[dict[str, Any]]:
    """Workers whose heartbeat is newer than ``since`` and that have not stopped."""
    rows = session.scalars(
        select(Worker).where(Worker.last_heartbeat >= since, Worker.stopped_at.is_(None)).order_by(Worker.name)
    )
    return [
        {
            "name": w.name,
            "label": w.label,
            "backend": w.backend,
            "busy_items": w.busy_items,
            "rollouts": w.rollouts_done,
            "tokens": w.tokens_done,
            "last_heartbeat": w.last_heartbeat,
            "engine_s": w.engine_s,
            "grades": dict(w.grades or {}),
        }
        for w in rows
    ]


def live_worker_count(session: Session, since: float) -> int:
    return int(
        session.scalar(select(func.count()).where(Worker.last_heartbeat >= since, Worker.stopped_at.is_(None))) or 0
    )


# --- progress ------------------------------------------------------------------------


def progress(session: Session) -> list[dict[str, Any]]:
    """One row per problem set, as the ``annotation_progress`` view has it.

    On PostgreSQL from the trigger-kept counters (a few rows per set, whatever the size of
    the database); on SQLite (small, embedded) from the view itself.
    """
    if session.get_bind().dialect.name != "postgresql":
        ids = dict(session.execute(select(ProblemSet.name, ProblemSet.id)).all())
        per_set: dict[int, dict[str, int]] = {}
        for sid, state, count in session.execute(
            select(Problem.problem_set_id, RolloutWork.state, func.count())
            .join(Trajectory, Trajectory.id == RolloutWork.trajectory_id)
            .join(Problem, Problem.id == Trajectory.problem_id)
            .group_by(Problem.problem_set_id, RolloutWork.state)
        ):
            per_set.setdefault(sid, {})[state] = int(count)
        rows = session.execute(text("SELECT * FROM annotation_progress ORDER BY problem_set"))
        return [
            {**r._mapping, "problem_set_id": ids[r.problem_set], "work": per_set.get(ids[r.problem_set], {})}
            for r in rows
        ]
    sums = {
        c: func.coalesce(func.sum(getattr(SetCounters, c)), 0).label(c)
        for c in (
            "problems", "trajectories", "chunks", "rollouts", "chunks_done", "rollouts_done",
            "work_pending", "work_queued", "work_running", "work_done", "work_failed",
        )
    }  # fmt: skip
    counts = select(SetCounters.problem_set_id, *sums.values()).group_by(SetCounters.problem_set_id).subquery()
    labels = (
        select(
            LabelCounters.problem_set_id,
            LabelCounters.rule,
            func.sum(LabelCounters.labelled).label("labelled"),
            func.sum(LabelCounters.positive).label("positive"),
        )
        .group_by(LabelCounters.problem_set_id, LabelCounters.rule)
        .subquery()
    )
    rows = session.execute(
        select(ProblemSet, counts, labels.c.labelled, labels.c.positive)
        .outerjoin(counts, counts.c.problem_set_id == ProblemSet.id)
        .outerjoin(labels, and_(labels.c.problem_set_id == ProblemSet.id, labels.c.rule == ProblemSet.label_rule))
        .order_by(ProblemSet.name)
    )
    out = []
    for r in rows:
        pset: ProblemSet = r[0]
        m = r._mapping
        n = {c: int(m[c] or 0) for c in sums}
        labelled = int(m["labelled"] or 0)
        out.append(
            {
                "problem_set": pset.name,
                "problem_set_id": pset.id,
                "rollouts_per_prefix": pset.rollouts_per_prefix,
                "label_rule": pset.label_rule,
                "budget_policy": pset.budget_policy,
                "problems": n["problems"],
                "trajectories": n["trajectories"],
                "trajectories_done": n["work_done"],
                "chunks": n["chunks"],
                "rollouts_done": n["rollouts"],
                "rollouts_planned": n["chunks"] * pset.rollouts_per_prefix,
                "rollouts_saved": n["chunks_done"] * pset.rollouts_per_prefix - n["rollouts_done"],
                "labelled_chunks": labelled,
                "positive_share": (int(m["positive"] or 0) / labelled) if labelled else None,
                "work": {s: n[f"work_{s}"] for s in ("pending", "queued", "running", "done", "failed")},
            }
        )
    return out


def record_progress(session: Session, now: float) -> int:
    """One progress sample per set (from the counters: cheap at any size)."""
    rows = [
        {
            "problem_set_id": sid,
            "at": now,
            "rollouts": r["rollouts_done"],
            "trajectories_done": r["trajectories_done"],
            "labelled_chunks": r["labelled_chunks"],
        }
        for r in progress(session)
        if (sid := r.get("problem_set_id")) is not None
    ]
    if rows:
        session.execute(_insert(session, ProgressSample.__table__), rows)
    return len(rows)


def progress_since(session: Session, since: float) -> dict[int, tuple[float, int]]:
    """set id -> (at, rollouts) of its oldest sample at or after ``since``."""
    first = (
        select(ProgressSample.problem_set_id, func.min(ProgressSample.at).label("at"))
        .where(ProgressSample.at >= since)
        .group_by(ProgressSample.problem_set_id)
        .subquery()
    )
    rows = session.execute(
        select(ProgressSample.problem_set_id, ProgressSample.at, ProgressSample.rollouts).join(
            first, and_(first.c.problem_set_id == ProgressSample.problem_set_id, first.c.at == ProgressSample.at)
        )
    )
    return {sid: (float(at), int(n)) for sid, at, n in rows}


def progress_history(session: Session, set_id: int) -> list[tuple[float, int, int, int]]:
    """(at, rollouts, trajectories done, labelled chunks) of a set over time."""
    rows = session.execute(
        select(
            ProgressSample.at, ProgressSample.rollouts, ProgressSample.trajectories_done, ProgressSample.labelled_chunks
        )
        .where(ProgressSample.problem_set_id == set_id)
        .order_by(ProgressSample.at)
    )
    return [(float(a), int(b), int(c), int(d)) for a, b, c, d in rows]


def recount(session: Session) -> None:
    """Rebuild the progress counters from the tables (after a bulk load with triggers off)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT stepq_recount()"))


def segmentation_stats(session: Session) -> list[dict[str, Any]]:
    """Chunks per trajectory and chunk length per set and segmentation method (a view)."""
    rows = session.execute(text("SELECT * FROM segmentation_stats ORDER BY problem_set, segmentation"))
    return [
        {
            k: (round(float(v), 2) if k.endswith("_chunk") or k == "chunks_per_trajectory" else v)
            for k, v in r._mapping.items()
        }
        for r in rows
    ]
