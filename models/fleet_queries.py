"""Locks, worker heartbeats and progress: what status, metrics and the dispatcher read.

Part of ``stepq.models.queries`` (import them from there); the same rules hold: no SQL
outside ``models``, idempotent writes, conditional updates for ownership.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, delete, func, select, text, update
from sqlalchemy.orm import Session

from stepq.models import leases
from stepq.models.base import epoch
from stepq.models.counters import EventCount, LabelCounters, ProgressSample, SetCounters
from stepq.models.problems import Problem, ProblemSet
from stepq.models.rollouts import Rollout
from stepq.models.sql import _insert, insert_ignore
from stepq.models.trajectories import Trajectory
from stepq.models.work import Lock, RolloutWork, Worker

# --- locks and workers --------------------------------------------------------------


def acquire_lock(session: Session, name: str, owner: str, ttl: float) -> bool:
    """Take or renew a named lease; True when ``owner`` holds it afterwards (taking it, not
    renewing it, records when)."""
    now = epoch()
    for _ in range(3):
        insert_ignore(session, Lock, [{"name": name, "lease_owner": owner, "lease_expires_at": now + ttl}])
        held = session.execute(
            select(Lock.lease_owner, Lock.lease_expires_at, Lock.acquired_at).where(Lock.name == name)
        ).first()
        if held is not None:
            break
        # The holder released it (deleted the row) between our insert, which met its row, and
        # this read: the name is free now, so insert again.
    else:
        return False
    renewing = held.lease_owner == owner and held.lease_expires_at >= now and held.acquired_at is not None
    leases.take(session, Lock, Lock.name == name, owner, ttl, reentrant=True)
    if session.scalar(select(Lock.lease_owner).where(Lock.name == name)) != owner:
        return False
    if not renewing:
        session.execute(update(Lock).where(Lock.name == name, Lock.lease_owner == owner).values(acquired_at=now))
    return True


def lock_state(session: Session, name: str) -> dict[str, Any] | None:
    """The live holder of a named lease, since when it holds it and when its lease ends."""
    row = session.execute(
        select(Lock.lease_owner, Lock.acquired_at, Lock.lease_expires_at).where(
            Lock.name == name, Lock.lease_expires_at >= epoch()
        )
    ).first()
    if row is None:
        return None
    return {"holder": row.lease_owner, "since": row.acquired_at, "expires_at": row.lease_expires_at}


def release_lock(session: Session, name: str, owner: str) -> None:
    session.execute(delete(Lock).where(Lock.name == name, Lock.lease_owner == owner))


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
    unhealthy: str | None = None,
    refused: str | None = None,
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
        unhealthy=unhealthy,
        refused=refused,
    )
    table = Worker.__table__.c
    updates: dict[str, Any] = {
        "last_heartbeat": stmt.excluded.last_heartbeat,
        "backend": stmt.excluded.backend,
        "stopped_at": None,
        "rollouts_done": table.rollouts_done + stmt.excluded.rollouts_done,
        "tokens_done": table.tokens_done + stmt.excluded.tokens_done,
        "unhealthy": stmt.excluded.unhealthy,
        "refused": stmt.excluded.refused,
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
            "unhealthy": w.unhealthy,
            "refused": w.refused,
        }
        for w in rows
    ]


def host_workers(session: Session, hostname: str) -> list[dict[str, Any]]:
    """The worker processes of one host that have not stopped, the latest heartbeat first."""
    rows = session.scalars(
        select(Worker)
        .where(Worker.hostname == hostname, Worker.stopped_at.is_(None))
        .order_by(Worker.last_heartbeat.desc())
    )
    return [
        {"name": w.name, "last_heartbeat": w.last_heartbeat, "busy_items": w.busy_items, "unhealthy": w.unhealthy}
        for w in rows
    ]


def silent_worker_count(session: Session, live_since: float, seen_since: float) -> int:
    """Workers that have not stopped but whose last heartbeat is older than ``live_since``
    and newer than ``seen_since``: crashed, frozen or cut off, and not yet forgotten."""
    return int(
        session.scalar(
            select(func.count()).where(
                Worker.last_heartbeat < live_since, Worker.last_heartbeat >= seen_since, Worker.stopped_at.is_(None)
            )
        )
        or 0
    )


def live_worker_count(session: Session, since: float) -> int:
    """Workers that beat since ``since``, have not stopped, and still take work (not unhealthy)."""
    fit = (Worker.last_heartbeat >= since, Worker.stopped_at.is_(None), Worker.unhealthy.is_(None))
    return int(session.scalar(select(func.count()).where(*fit)) or 0)


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
            select(RolloutWork.problem_set_id, RolloutWork.state, func.count()).group_by(
                RolloutWork.problem_set_id, RolloutWork.state
            )
        ):
            per_set.setdefault(sid, {})[state] = int(count)
        tokens: dict[int, tuple[int, int]] = {
            sid: (int(generated or 0), int(prompt or 0))
            for sid, generated, prompt in session.execute(
                select(
                    Problem.problem_set_id,
                    func.coalesce(func.sum(Rollout.tokens), 0),
                    func.coalesce(func.sum(Rollout.prompt_tokens), 0),
                )
                .join(Trajectory, Trajectory.problem_id == Problem.id)
                .join(Rollout, Rollout.trajectory_id == Trajectory.id)
                .group_by(Problem.problem_set_id)
            )
        }
        rows = session.execute(text("SELECT * FROM annotation_progress ORDER BY problem_set"))
        return [
            {
                **r._mapping,
                "problem_set_id": ids[r.problem_set],
                "work": per_set.get(ids[r.problem_set], {}),
                "tokens": tokens.get(ids[r.problem_set], (0, 0))[0],
                "prompt_tokens": tokens.get(ids[r.problem_set], (0, 0))[1],
            }
            for r in rows
        ]
    sums = {
        c: func.coalesce(func.sum(getattr(SetCounters, c)), 0).label(c)
        for c in (
            "problems", "trajectories", "chunks", "rollouts", "chunks_done", "rollouts_done", "tokens", "prompt_tokens",
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
                "tokens": n["tokens"],
                "prompt_tokens": n["prompt_tokens"],
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


def lock_holder(session: Session, name: str) -> str | None:
    """Who holds a named lease now (None: nobody, or it expired)."""
    return session.scalar(select(Lock.lease_owner).where(Lock.name == name, Lock.lease_expires_at >= epoch()))
