"""What a round of ``bench_active`` chose to label: the trajectories it spent its rollouts on,
described by the synthetic policy's truth.

The headline says whether an ordering pays; this says why or why not.  For the trajectories
a round labelled (those with labels now that had none before it): how many, the share ending
in a wrong answer, the share holding a wrong step and where the first one is, the share of
their labelled chunks that are dead prefixes (past the first wrong step: a first-error
snapshot keeps none of them), and the label noise (Monte Carlo label against the truth,
``ground_truth``: this chunk and every one before it right) on their chunks.  A strategy
that picks trajectories whose errors come late, or whose labels are noisier, teaches the next
judge less per rollout than random order does.
"""

from __future__ import annotations

from collections.abc import Set
from typing import Any

from sqlalchemy import select

from stepq.models import Database
from stepq.models.rollouts import ChunkLabel
from stepq.models.trajectories import Chunk, Trajectory


def labelled(db: Database) -> dict[int, dict[str, Any]]:
    """Every labelled trajectory: its outcome and its chunks' (idx, truth, label) in order."""
    with db.session() as s:
        rows = s.execute(
            select(Trajectory.id, Trajectory.outcome, Chunk.idx, Chunk.ground_truth, ChunkLabel.positive)
            .join(Chunk, Chunk.trajectory_id == Trajectory.id)
            .join(ChunkLabel, ChunkLabel.chunk_id == Chunk.id)
            .order_by(Trajectory.id, Chunk.idx)
        ).all()
    out: dict[int, dict[str, Any]] = {}
    for tid, outcome, idx, truth, positive in rows:
        entry = out.setdefault(int(tid), {"outcome": outcome, "chunks": []})
        entry["chunks"].append((int(idx), truth, bool(positive)))
    return out


def describe(picked: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The picked trajectories' figures (None where there is nothing to average)."""
    n = len(picked)
    wrong_answer = sum(t["outcome"] is False for t in picked.values())
    firsts = []
    chunks = dead = noisy = 0
    for t in picked.values():
        truths = [truth for _, truth, _ in t["chunks"]]
        first = next((idx for idx, truth, _ in t["chunks"] if truth is False), None)
        if first is not None:
            firsts.append(first)
        for (_, truth, positive), prior in zip(t["chunks"], [True, *truths[:-1]], strict=True):
            if truth is None:
                continue
            chunks += 1
            dead += truth is False and prior is False
            noisy += positive != truth
    return {
        "trajectories": n,
        "wrong_answer_share": wrong_answer / n if n else None,
        "with_error_share": len(firsts) / n if n else None,
        "mean_first_error_step": sum(firsts) / len(firsts) if firsts else None,
        "dead_prefix_share": dead / chunks if chunks else None,
        "label_noise": noisy / chunks if chunks else None,
    }


def round_picks(db: Database, seen: Set[int]) -> tuple[dict[str, Any], set[int]]:
    """The figures of the trajectories labelled since ``seen`` (those labelled before this
    round), and every labelled trajectory's id now (the next round's ``seen``)."""
    now = labelled(db)
    return describe({tid: t for tid, t in now.items() if tid not in seen}), set(now)
