"""Queries on problem sets, problems and trajectories: create, look up, grow, update, delete.

Part of ``stepq.models.queries`` (import them from there); the same rules hold: no SQL
outside ``models``, idempotent writes, conditional updates for ownership.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session

from stepq.models.counters import LabelCounters, ProgressSample, SetCounters
from stepq.models.errors import ConfigError, NotFoundError, Superseded, WrongGenerator
from stepq.models.fleet_queries import progress
from stepq.models.problems import Problem, ProblemSet
from stepq.models.rollouts import ChunkLabel, QValue, Rollout
from stepq.models.sql import insert_ignore
from stepq.models.trajectories import GIVEN_STEPS, Chunk, Trajectory
from stepq.models.wakeup import announce
from stepq.models.work import RolloutWork

# --- problem sets -------------------------------------------------------------------


def pause_set(session: Session, name: str, paused: bool) -> bool:
    """Pause or resume a set; returns whether it changed.  A paused set's pending items are
    not published and its queued ones are not claimed; running ones finish their batch."""
    pset = get_set(session, name)
    changed = pset.paused != paused
    pset.paused = paused
    if changed and not paused:
        announce(session)
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


def get_set(session: Session, name: str, for_update: bool = False) -> ProblemSet:
    """The named set; ``for_update``: its row locked until the transaction ends (PostgreSQL), so
    two commands changing its settings at once run one after the other, the second seeing the
    first's values."""
    query = select(ProblemSet).where(ProblemSet.name == name)
    found = session.scalar(query.with_for_update() if for_update else query)
    if found is None:
        raise no_such_set(session, name)
    return found


def no_such_set(session: Session, name: str) -> NotFoundError:
    """The error for a set that does not exist, naming the sets that do (a typo shows at once)."""
    names = list(session.scalars(select(ProblemSet.name).order_by(ProblemSet.name).limit(21)))
    listed = ", ".join(f"'{n}'" for n in names[:20]) + (", ..." if len(names) > 20 else "")
    return NotFoundError(f"no problem set named '{name}' (sets here: {listed or 'none'}; see 'stepq status')")


def check_set_name(name: str) -> None:
    """A new set's name must be addressable as typed: ``--sets "p,q"`` reads two sets, and a
    shell or a list strips the spaces around a name, so such names are refused at creation."""
    reason = None
    if not name.strip():
        reason = "is empty"
    elif name != name.strip():
        reason = "starts or ends with white space"
    elif "," in name:
        reason = "holds a comma (--sets reads a comma-separated list)"
    elif any(not ch.isprintable() for ch in name):
        reason = "holds a control character"
    elif len(name) > MAX_SET_NAME:
        reason = f"is longer than {MAX_SET_NAME} characters"
    if reason:
        raise ConfigError(f"set name {name!r} {reason}: choose another")


MAX_SET_NAME = 200
"""The column's width."""


def ensure_set(session: Session, name: str, **config: Any) -> ProblemSet:
    """Return the set, creating it with ``config`` when it does not exist yet (under a name that
    ``check_set_name`` accepts)."""
    if session.scalar(select(ProblemSet.id).where(ProblemSet.name == name)) is None:
        check_set_name(name)
    insert_ignore(session, ProblemSet, [{"name": name, "backend_config": {}, "sampling": {}, **config}])
    return get_set(session, name)


def problem_external_ids(session: Session, problem_ids: Iterable[int]) -> dict[int, str]:
    """Each problem's external id: what names it outside this database."""
    ids = sorted(set(problem_ids))
    found: dict[int, str] = {}
    for start in range(0, len(ids), 1000):
        rows = session.execute(select(Problem.id, Problem.external_id).where(Problem.id.in_(ids[start : start + 1000])))
        found.update({int(pid): str(ext) for pid, ext in rows})
    return found


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


def ingested_texts(session: Session, problem_ids: Sequence[int]) -> set[tuple[int, str]]:
    """(problem id, text) of the trajectories ingested from files for these problems: the same
    steps arriving in another file (a renamed or merged copy) are the same trajectory."""
    if not problem_ids:
        return set()
    rows = session.execute(
        select(Trajectory.problem_id, Trajectory.text).where(
            Trajectory.problem_id.in_(problem_ids), Trajectory.source_key.like("ingested:%")
        )
    )
    return {(pid, text) for pid, text in rows}


def delete_trajectories_of(session: Session, problem_ids: Sequence[int]) -> int:
    """Drop these problems' trajectories with everything annotated on them (cascades)."""
    tids = trajectory_ids_of(session, problem_ids)
    if not tids:
        return 0
    # Snapshots holding these chunks keep their own copy of the text (snapshot_texts).
    chunk_ids = select(Chunk.id).where(Chunk.trajectory_id.in_(tids))
    session.execute(delete(ChunkLabel).where(ChunkLabel.chunk_id.in_(chunk_ids)))
    session.execute(delete(QValue).where(QValue.trajectory_id.in_(tids)))
    session.execute(delete(Rollout).where(Rollout.trajectory_id.in_(tids)))
    session.execute(delete(RolloutWork).where(RolloutWork.trajectory_id.in_(tids)))
    session.execute(delete(Chunk).where(Chunk.trajectory_id.in_(tids)))
    result = session.execute(delete(Trajectory).where(Trajectory.id.in_(tids)))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def set_has_rollouts(session: Session, set_id: int) -> bool:
    first = select(Rollout.id).where(Rollout.trajectory_id.in_(_set_trajectories(set_id))).limit(1)
    return session.scalar(first) is not None


def discard_rollouts(session: Session, set_id: int) -> int:
    """Drop a set's rollouts with the Q-values and labels derived from them (Q(n), the
    trajectories' own outcomes, stay): what ``--resample`` does before sampling again with new
    settings, so no label mixes two generators.  The set's sampling generation goes up first,
    in the same transaction: a worker's batch of the old sampling, committed before, is dropped
    here; one committed after sees the new generation and is not written
    (``fence_write``).  Returns how many rollouts were dropped."""
    session.execute(
        update(ProblemSet)
        .where(ProblemSet.id == set_id)
        .values(sampling_generation=ProblemSet.sampling_generation + 1, generator=None)
    )
    tids = _set_trajectories(set_id)
    chunk_ids = select(Chunk.id).where(Chunk.trajectory_id.in_(tids))
    session.execute(delete(ChunkLabel).where(ChunkLabel.chunk_id.in_(chunk_ids)))
    session.execute(delete(QValue).where(QValue.trajectory_id.in_(tids), QValue.source != "outcome"))
    result = session.execute(delete(Rollout).where(Rollout.trajectory_id.in_(tids)))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def fence_write(session: Session, set_id: int, generation: int, generator: str, *, recheck: bool = False) -> None:
    """The fence of a worker's write: raise ``Superseded`` when the set was resampled since the
    worker loaded it, ``WrongGenerator`` when its rollouts are another generator's (the first
    batch written pins the set's).  On PostgreSQL the row is locked first in the transaction (a
    resample locks it first too): a resample committed meanwhile is seen, one under way is
    waited for, and one that starts after waits for this transaction (its delete then sees the
    batch).  The lock is shared once the set is pinned, so writers of one set go side by side;
    a write that may pin takes it exclusive from the start, because two first batches that both
    held it shared and then both pinned would deadlock (one batch lost, its work done twice).
    SQLite reads outside its write lock: the writer checks again last (``recheck``, a no-op on
    PostgreSQL, whose first read holds the row until commit)."""
    postgres = session.get_bind().dialect.name == "postgresql"
    if recheck and postgres:
        return
    query = select(ProblemSet.sampling_generation, ProblemSet.generator, ProblemSet.name).where(ProblemSet.id == set_id)
    if postgres:
        # Unlocked, only to choose the lock: a pinned set is unpinned only by a resample,
        # which also moves the generation that the locked read below checks.
        may_pin = session.scalar(select(ProblemSet.generator).where(ProblemSet.id == set_id)) is None
        query = query.with_for_update(read=not may_pin, key_share=may_pin)
    current, pinned, name = session.execute(query).one()
    if current != generation:
        raise Superseded(f"set {set_id} was resampled (generation {generation} -> {current}): batch not written")
    if pinned is None:  # the first batch: pin it (on SQLite a concurrent first batch loses here)
        session.execute(
            update(ProblemSet)
            .where(ProblemSet.id == set_id, ProblemSet.generator.is_(None))
            .values(generator=generator)
        )
        pinned = session.scalar(select(ProblemSet.generator).where(ProblemSet.id == set_id))
    if pinned != generator:
        raise WrongGenerator(wrong_generator(name, str(pinned), generator))


def wrong_generator(set_name: str, pinned: str, mine: str) -> str:
    return f"set '{set_name}' is sampled by {pinned}; this worker generates with {mine}"


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
    result = session.execute(
        update(ProblemSet)
        .where(ProblemSet.id == set_id, ProblemSet.needs_planning.is_(False))
        .values(needs_planning=True)
    )
    if result.rowcount:  # type: ignore[attr-defined]  # once per flagging, not per trajectory added
        announce(session)


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


def given_chunks(session: Session, trajectory_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The trajectories among ``trajectory_ids`` whose chunks a re-cut would lose: steps given
    by the data (ingested as such) or chunks carrying per-step truth; each with its chunks, its
    problem's external id and its segmentation, as they are now."""
    given = select(Trajectory.id).where(
        Trajectory.id.in_(trajectory_ids),
        or_(
            Trajectory.segmentation == GIVEN_STEPS,
            select(Chunk.id).where(Chunk.trajectory_id == Trajectory.id, Chunk.ground_truth.is_not(None)).exists(),
        ),
    )
    rows = session.execute(
        select(Trajectory.id, Trajectory.segmentation, Problem.external_id, Chunk.idx, Chunk.text, Chunk.ground_truth)
        .join(Problem, Problem.id == Trajectory.problem_id)
        .join(Chunk, Chunk.trajectory_id == Trajectory.id)
        .where(Trajectory.id.in_(given))
        .order_by(Trajectory.id, Chunk.idx)
    )
    out: dict[int, dict[str, Any]] = {}
    for tid, method, external_id, idx, text, truth in rows:
        entry = out.setdefault(
            int(tid), {"trajectory_id": int(tid), "external_id": external_id, "segmentation": method, "chunks": []}
        )
        entry["chunks"].append({"idx": int(idx), "text": text, "ground_truth": truth})
    return out


def replace_chunks(session: Session, trajectory_id: int, chunks: Sequence[str], method: str) -> bool:
    """Cut a trajectory anew, if it is still unannotated: checked here, in the transaction that
    replaces the chunks (the trajectory row locked), not minutes earlier before slow segmenter
    calls, so a set planned for annotation meanwhile keeps the chunks its work was planned on.
    Returns whether it was cut."""
    session.execute(select(Trajectory.id).where(Trajectory.id == trajectory_id).with_for_update())
    annotated = session.scalar(
        select(
            or_(
                select(RolloutWork.id).where(RolloutWork.trajectory_id == trajectory_id).exists(),
                select(Rollout.id).where(Rollout.trajectory_id == trajectory_id).exists(),
            )
        )
    )
    if annotated:
        return False
    session.execute(delete(Chunk).where(Chunk.trajectory_id == trajectory_id))
    session.execute(
        update(Trajectory).where(Trajectory.id == trajectory_id).values(n_chunks=len(chunks), segmentation=method)
    )
    insert_ignore(
        session,
        Chunk,
        [{"trajectory_id": trajectory_id, "idx": i + 1, "text": c, "ground_truth": None} for i, c in enumerate(chunks)],
    )
    return True


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


def _set_trajectories(set_id: int) -> Any:
    return (
        select(Trajectory.id).join(Problem, Problem.id == Trajectory.problem_id).where(Problem.problem_set_id == set_id)
    )


def set_trajectory_ids(session: Session, set_id: int, limit: int | None = None) -> list[int]:
    return list(session.scalars(_set_trajectories(set_id).order_by(Trajectory.id).limit(limit)))
