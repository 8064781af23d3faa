"""The trainer's queries: labelled chunks, snapshots, training runs and their metrics.

The annotation engine's queries live in ``queries.py``; these serve the trainer and the
evaluation commands, against the same tables, and follow the same rules: no SQL outside
``models``, idempotent writes, conditional updates for ownership.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.orm import Session

from stepq.models import leases
from stepq.models.base import epoch
from stepq.models.errors import ConfigError, NotFoundError
from stepq.models.problems import Problem, ProblemSet
from stepq.models.rollouts import ChunkLabel, QValue, Rollout
from stepq.models.snapshots import Snapshot, SnapshotRow, SnapshotText
from stepq.models.sql import _insert, upsert
from stepq.models.training import RUN_DONE, RUN_FAILED, RUN_RUNNING, TrainingMetric, TrainingRun
from stepq.models.trajectories import Chunk, Trajectory

# --- labelled chunks ----------------------------------------------------------------


def _labelled(set_ids: Sequence[int], rule: str) -> Any:
    return (
        select(
            Chunk.id,
            Chunk.trajectory_id,
            Trajectory.problem_id,
            Chunk.idx,
            ChunkLabel.positive,
            ChunkLabel.q_before,
            ChunkLabel.q_after,
        )
        .join(ChunkLabel, ChunkLabel.chunk_id == Chunk.id)
        .join(Trajectory, Trajectory.id == Chunk.trajectory_id)
        .join(Problem, Problem.id == Trajectory.problem_id)
        .where(ChunkLabel.rule == rule, Problem.problem_set_id.in_(list(set_ids)), Problem.excluded.is_(False))
    )


def labelled_chunks(session: Session, set_ids: Sequence[int], rule: str) -> list[tuple[Any, ...]]:
    """(chunk, trajectory, problem, idx, positive, q_before, q_after) under ``rule``."""
    return [tuple(r) for r in session.execute(_labelled(set_ids, rule).order_by(Chunk.id))]


def count_labelled(session: Session, set_ids: Sequence[int], rule: str) -> int:
    return int(session.scalar(select(func.count()).select_from(_labelled(set_ids, rule).subquery())) or 0)


def rules_labelled(session: Session, set_ids: Sequence[int]) -> dict[str, list[str]]:
    """The label rules these sets hold labels under, each with the sets' names."""
    rows = session.execute(
        select(ChunkLabel.rule, ProblemSet.name)
        .join(Chunk, Chunk.id == ChunkLabel.chunk_id)
        .join(Trajectory, Trajectory.id == Chunk.trajectory_id)
        .join(Problem, Problem.id == Trajectory.problem_id)
        .join(ProblemSet, ProblemSet.id == Problem.problem_set_id)
        .where(Problem.problem_set_id.in_(list(set_ids)), Problem.excluded.is_(False))
        .distinct()
        .order_by(ChunkLabel.rule, ProblemSet.name)
    ).all()
    out: dict[str, list[str]] = {}
    for rule, name in rows:
        out.setdefault(rule, []).append(name)
    return out


def rollouts_behind(session: Session, trajectory_ids: Sequence[int]) -> int:
    """Rollouts drawn for these trajectories: what the snapshot's labels cost."""
    total = 0
    ids = sorted(set(trajectory_ids))
    for start in range(0, len(ids), 10_000):
        part = ids[start : start + 10_000]
        total += int(session.scalar(select(func.count(Rollout.id)).where(Rollout.trajectory_id.in_(part))) or 0)
    return total


def set_ids_by_name(session: Session, names: Sequence[str]) -> list[int]:
    found = dict(session.execute(select(ProblemSet.name, ProblemSet.id).where(ProblemSet.name.in_(list(names)))).all())
    missing = [n for n in names if n not in found]
    if missing:
        raise NotFoundError(f"no problem set named {', '.join(repr(m) for m in missing)} (see 'stepq status')")
    return [found[n] for n in names]


# --- snapshots ----------------------------------------------------------------------


def insert_snapshot(session: Session, snapshot: dict[str, Any], rows: Sequence[dict[str, Any]]) -> int:
    """Write a snapshot, its rows and the text they were labelled on (frozen now, in the
    caller's transaction, so it is the text the labels were read with); returns its id."""
    snap = Snapshot(**snapshot)
    session.add(snap)
    session.flush()
    if rows:
        session.connection().execute(insert(SnapshotRow), [{**r, "snapshot_id": snap.id} for r in rows])
        texts = _live_texts(session, sorted({r["trajectory_id"] for r in rows}))
        session.connection().execute(
            insert(SnapshotText),
            [
                {"snapshot_id": snap.id, "trajectory_id": tid, "question": question, "chunks": chunks}
                for tid, (question, chunks) in texts.items()
            ],
        )
    return snap.id


def _live_texts(session: Session, trajectory_ids: Sequence[int]) -> dict[int, tuple[str, list[str]]]:
    """Each trajectory's question and chunk texts as the tables hold them now."""
    out: dict[int, tuple[str, list[str]]] = {}
    for start in range(0, len(trajectory_ids), 1000):
        part = list(trajectory_ids[start : start + 1000])
        rows = session.execute(
            select(Trajectory.id, Problem.question, Chunk.text)
            .join(Problem, Problem.id == Trajectory.problem_id)
            .join(Chunk, Chunk.trajectory_id == Trajectory.id)
            .where(Trajectory.id.in_(part))
            .order_by(Trajectory.id, Chunk.idx)
        )
        for tid, question, chunk_text in rows:
            out.setdefault(tid, (question, []))[1].append(chunk_text)
    return out


def snapshot_name_taken(session: Session, name: str) -> bool:
    return session.scalar(select(Snapshot.id).where(Snapshot.name == name)) is not None


def next_snapshot_number(session: Session) -> int:
    return int(session.scalar(select(func.coalesce(func.max(Snapshot.id), 0))) or 0) + 1


def get_snapshot(session: Session, ref: str | int) -> Snapshot:
    """A snapshot by number or by name."""
    key = str(ref)
    match = Snapshot.id == int(key) if key.isdigit() else Snapshot.name == key
    found = session.scalar(select(Snapshot).where(match))
    if found is None:
        raise NotFoundError(f"no snapshot {key!r} (see 'stepq snapshot list')")
    return found


def delete_snapshot(session: Session, ref: str | int, *, trained: bool = False) -> dict[str, Any]:
    """Remove a snapshot and its rows and texts.  A snapshot a run trained on is refused unless
    ``trained``: then the runs keep their rows (metrics, checkpoints, models on disk) and say in
    ``dataset`` which snapshot they trained on, since they can no longer point at it."""
    snap = get_snapshot(session, ref)
    runs = list(session.scalars(select(TrainingRun).where(TrainingRun.snapshot_id == snap.id)))
    if runs and not trained:
        listed = ", ".join(str(r.id) for r in runs)
        raise ConfigError(
            f"snapshot {snap.id} ({snap.name}) was trained on by training run(s) {listed}: pass --trained to "
            "delete it anyway (the runs keep their rows and models, and name the deleted snapshot)"
        )
    for run in runs:
        gone = f"snapshot {snap.id} ({snap.name}, deleted)"
        session.execute(
            update(TrainingRun)
            .where(TrainingRun.id == run.id)
            .values(snapshot_id=None, dataset=f"{run.dataset}; {gone}" if run.dataset else gone)
        )
    rows = session.execute(delete(SnapshotRow).where(SnapshotRow.snapshot_id == snap.id)).rowcount  # type: ignore[attr-defined]
    session.execute(delete(SnapshotText).where(SnapshotText.snapshot_id == snap.id))
    session.execute(delete(Snapshot).where(Snapshot.id == snap.id))
    return {"snapshot": snap.id, "name": snap.name, "rows": int(rows or 0), "runs": [r.id for r in runs]}


def latest_snapshot(session: Session, lineage: str) -> Snapshot | None:
    return session.scalar(select(Snapshot).where(Snapshot.lineage == lineage).order_by(Snapshot.id.desc()).limit(1))


def snapshot_summaries(session: Session) -> list[dict[str, Any]]:
    rows = session.execute(text("SELECT * FROM snapshot_summary ORDER BY snapshot")).mappings().all()
    return [dict(r) for r in rows]


def snapshot_rows(session: Session, snapshot_id: int, split: str | None = None) -> list[SnapshotRow]:
    query = select(SnapshotRow).where(SnapshotRow.snapshot_id == snapshot_id)
    if split is not None:
        query = query.where(SnapshotRow.split == split)
    return list(session.scalars(query.order_by(SnapshotRow.split, SnapshotRow.chunk_id)))


def snapshot_contexts(session: Session, snapshot_id: int) -> dict[int, dict[str, Any]]:
    """Per trajectory of a snapshot: the problem's ids and the question and chunks exactly as
    they were when the snapshot was made; what rendering a judge prompt needs (the history
    is the chunks before the judged one)."""
    origin = {
        tid: (ext, set_name)
        for tid, ext, set_name in session.execute(
            select(SnapshotRow.trajectory_id, Problem.external_id, ProblemSet.name)
            .join(Problem, Problem.id == SnapshotRow.problem_id)
            .join(ProblemSet, ProblemSet.id == Problem.problem_set_id)
            .where(SnapshotRow.snapshot_id == snapshot_id)
            .distinct()
        )
    }
    out: dict[int, dict[str, Any]] = {}
    for tid, question, chunks in session.execute(
        select(SnapshotText.trajectory_id, SnapshotText.question, SnapshotText.chunks).where(
            SnapshotText.snapshot_id == snapshot_id
        )
    ):
        ext, set_name = origin.get(tid, (None, None))
        out[tid] = {"problem_id": ext, "question": question, "set": set_name, "chunks": list(chunks)}
    return out


def scored_trajectories(session: Session, set_name: str) -> list[dict[str, Any]]:
    """A set's trajectories with their policy prompt, chunks and Q(0..n) (None where a prefix
    has no samples): what Q-derived preference pairs are made of."""
    set_id = session.scalar(select(ProblemSet.id).where(ProblemSet.name == set_name))
    if set_id is None:
        raise NotFoundError(f"no problem set named '{set_name}' (see 'stepq status')")
    out: dict[int, dict[str, Any]] = {}
    rows = session.execute(
        select(
            Trajectory.id,
            Trajectory.n_chunks,
            Trajectory.prompt,
            Problem.external_id,
            Problem.question,
            Chunk.idx,
            Chunk.text,
        )
        .join(Problem, Problem.id == Trajectory.problem_id)
        .join(Chunk, Chunk.trajectory_id == Trajectory.id)
        .where(Problem.problem_set_id == set_id, Problem.excluded.is_(False))
        .order_by(Trajectory.id, Chunk.idx)
    )
    for tid, n, prompt, ext, question, _idx, chunk_text in rows:
        entry = out.setdefault(
            tid, {"id": tid, "problem_id": ext, "question": question, "prompt": prompt, "chunks": [], "n": n}
        )
        entry["chunks"].append(chunk_text)
    q: dict[int, dict[int, float]] = {}
    for tid, k, value, n_samples in session.execute(
        select(QValue.trajectory_id, QValue.prefix_len, QValue.q, QValue.n_samples).where(
            QValue.trajectory_id.in_(list(out))
        )
    ):
        if n_samples:
            q.setdefault(tid, {})[k] = float(value)
    return [
        {**e, "chunks": tuple(e["chunks"]), "q": tuple(q.get(tid, {}).get(k) for k in range(e["n"] + 1))}
        for tid, e in out.items()
    ]


def trajectory_outcomes(session: Session, trajectory_ids: Sequence[int]) -> dict[int, bool | None]:
    """Each trajectory's outcome; None where it was not graded or held no parseable answer."""
    out: dict[int, bool | None] = {}
    for start in range(0, len(trajectory_ids), 1000):
        part = list(trajectory_ids[start : start + 1000])
        rows = session.execute(
            select(Trajectory.id, Trajectory.outcome, Trajectory.final_answer).where(Trajectory.id.in_(part))
        )
        out.update({int(tid): outcome if answer is not None else None for tid, outcome, answer in rows})
    return out


def rollout_pass_counts(
    session: Session, trajectory_ids: Sequence[int], *, from_problem_only: bool = False
) -> dict[int, tuple[int, int]]:
    """Per trajectory: (right, graded) over its rollouts with a parseable answer (kept text or
    not), or over those from prefix 0 alone (``from_problem_only``: responses to the problem
    itself, what a pass rate over a question's responses counts)."""
    out: dict[int, tuple[int, int]] = {}
    for start in range(0, len(trajectory_ids), 1000):
        part = list(trajectory_ids[start : start + 1000])
        where: list[Any] = [Rollout.trajectory_id.in_(part), Rollout.final_answer.is_not(None)]
        if from_problem_only:
            where.append(Rollout.prefix_len == 0)
        rows = session.execute(
            select(Rollout.trajectory_id, func.sum(Rollout.reward), func.count())
            .where(*where)
            .group_by(Rollout.trajectory_id)
        )
        out.update({int(tid): (int(right or 0), int(n)) for tid, right, n in rows})
    return out


def rollout_texts(
    session: Session, trajectory_ids: Sequence[int], *, after_id: int, limit: int, from_problem_only: bool = False
) -> list[Any]:
    """(id, trajectory id, prefix length, text, reward, final answer) of rollouts whose text
    was kept (from prefix 0 alone with ``from_problem_only``), in id order after ``after_id``:
    a page of what ``stepq export outcomes`` streams."""
    if not trajectory_ids:
        return []
    where: list[Any] = [Rollout.trajectory_id.in_(list(trajectory_ids)), Rollout.id > after_id, Rollout.text != ""]
    if from_problem_only:
        where.append(Rollout.prefix_len == 0)
    return list(
        session.execute(
            select(
                Rollout.id,
                Rollout.trajectory_id,
                Rollout.prefix_len,
                Rollout.text,
                Rollout.reward,
                Rollout.final_answer,
            )
            .where(*where)
            .order_by(Rollout.id)
            .limit(limit)
        )
    )


# --- training runs ------------------------------------------------------------------


def run_by_output(session: Session, output_dir: str) -> TrainingRun | None:
    return session.scalar(select(TrainingRun).where(TrainingRun.output_dir == output_dir))


def get_run(session: Session, run_id: int) -> TrainingRun:
    found = session.get(TrainingRun, run_id)
    if found is None:
        raise NotFoundError(f"no training run {run_id} (see 'stepq train list')")
    return found


def find_run(session: Session, ref: str) -> TrainingRun:
    """A run by id, or by its output folder (as given on the command line, made absolute)."""
    if ref.isdigit():
        return get_run(session, int(ref))
    from pathlib import Path

    found = run_by_output(session, str(Path(ref).resolve()))
    if found is None:
        raise NotFoundError(f"no training run writes to {ref} (see 'stepq train list')")
    return found


def create_run(session: Session, **fields: Any) -> int:
    """Insert a run unless one with this output dir exists; returns the run's id either way."""
    row = {"checkpoints": [], "global_step": 0, "resumes": 0, "updated_at": epoch(), "status": RUN_RUNNING, **fields}
    session.connection().execute(_insert(session, TrainingRun.__table__).on_conflict_do_nothing(), [row])
    run = run_by_output(session, fields["output_dir"])
    assert run is not None
    return run.id


def claim_run(session: Session, run_id: int, owner: str, ttl: float, host: str) -> bool:
    """Take the run's lease when it is free, expired or ours; False while another process
    trains it (its checkpoints must have one writer)."""
    values = {"host": host, "status": RUN_RUNNING, "updated_at": epoch()}
    return leases.take(session, TrainingRun, TrainingRun.id == run_id, owner, ttl, reentrant=True, **values)


def renew_run(session: Session, run_id: int, owner: str, ttl: float, **values: Any) -> bool:
    return bool(leases.renew(session, TrainingRun, TrainingRun.id == run_id, owner, ttl, updated_at=epoch(), **values))


def record_checkpoint(session: Session, run_id: int, owner: str, ttl: float, path: str, step: int) -> bool:
    """Add a written checkpoint to the run (once: a resumed run may save a step again) and make
    it the one to resume from; False when ``owner`` no longer holds the run."""
    run = get_run(session, run_id)
    checkpoints = list(run.checkpoints) if path in run.checkpoints else [*run.checkpoints, path]
    return renew_run(session, run_id, owner, ttl, last_checkpoint=path, checkpoints=checkpoints, global_step=step)


def end_run(session: Session, run_id: int, owner: str, *, error: str | None = None) -> None:
    now = epoch()
    status = RUN_FAILED if error else RUN_DONE
    finished = None if error else now
    leases.release(
        session,
        TrainingRun,
        TrainingRun.id == run_id,
        owner,
        status=status,
        error=error,
        updated_at=now,
        finished_at=finished,
    )


def upsert_metrics(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    columns = ("reward", "accuracy_positive", "accuracy_negative", "completion_length", "clip_ratio", "entropy", "loss")
    upsert(session, TrainingMetric, rows, ("run_id", "step"), (*columns, "values", "logged_at"))


def run_metrics(session: Session, run_id: int) -> list[TrainingMetric]:
    return list(session.scalars(select(TrainingMetric).where(TrainingMetric.run_id == run_id).order_by("step")))


def training_progress(session: Session) -> list[dict[str, Any]]:
    rows = session.execute(text("SELECT * FROM training_progress ORDER BY run")).mappings().all()
    return [dict(r) for r in rows]


def lineage_runs(session: Session, lineage: str) -> list[TrainingRun]:
    return list(session.scalars(select(TrainingRun).where(TrainingRun.lineage == lineage).order_by(TrainingRun.id)))


# --- evaluation ---------------------------------------------------------------------


def set_solutions(session: Session, set_id: int) -> dict[int, list[dict[str, Any]]]:
    """Per problem of a set: question, reference, and each trajectory's prompt, chunks,
    segmentation method, final answer and outcome (ordered by trajectory id, so "the first N" is stable)."""
    rows = session.execute(
        select(
            Problem.id,
            Problem.question,
            Problem.reference_answer,
            Trajectory.id,
            Trajectory.prompt,
            Trajectory.final_answer,
            Trajectory.outcome,
            Trajectory.segmentation,
            Chunk.text,
        )
        .join(Trajectory, Trajectory.problem_id == Problem.id)
        .join(Chunk, Chunk.trajectory_id == Trajectory.id)
        .where(Problem.problem_set_id == set_id, Problem.excluded.is_(False))
        .order_by(Problem.id, Trajectory.id, Chunk.idx)
    )
    out: dict[int, dict[int, dict[str, Any]]] = {}
    for pid, question, reference, tid, prompt, answer, outcome, segmentation, chunk in rows:
        entry = out.setdefault(pid, {}).setdefault(
            tid,
            {
                "question": question,
                "reference": reference,
                "prompt": prompt,
                "answer": answer,
                "outcome": outcome,
                "segmentation": segmentation,
                "chunks": [],
            },
        )
        entry["chunks"].append(chunk)
    return {pid: list(trajs.values()) for pid, trajs in out.items()}
