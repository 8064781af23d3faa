"""From rollout counts to Q-values and labels (pure), and applying them to one trajectory."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from models import queries
from models.trajectories import Chunk, Trajectory
from workers.labels import LabelRule, label_chunks


@dataclass(frozen=True)
class QEstimate:
    prefix_len: int
    n_samples: int
    n_correct: int
    source: str  # rollouts | outcome

    @property
    def q(self) -> float:
        return self.n_correct / self.n_samples if self.n_samples else 0.0


def estimates(stats: Mapping[int, tuple[int, int]], n_chunks: int, outcome: bool | None) -> list[QEstimate]:
    """Q(0..n-1) from (samples, successes) per prefix, and Q(n) from the outcome."""
    out = [QEstimate(k, n, c, "rollouts") for k, (n, c) in sorted(stats.items()) if k < n_chunks]
    out.append(QEstimate(n_chunks, 1, int(bool(outcome)), "outcome"))
    return out


def complete_q(ests: list[QEstimate], n_chunks: int, m: int) -> list[float | None]:
    """Q(0..n) where known with the full budget, None where samples are still missing."""
    q: list[float | None] = [None] * (n_chunks + 1)
    for e in ests:
        if e.source == "outcome" or e.n_samples >= m:
            q[e.prefix_len] = e.q
    return q


def refresh_trajectory(session: Session, traj: Trajectory, chunks: list[Chunk], m: int, rules: list[LabelRule]) -> int:
    """Recompute and store Q-values and labels for one trajectory from its rollout rows.

    Runs in the same transaction as the rollout writes, so stored Q-values always agree
    with the rows they summarise.  Returns the number of labelled chunks (first rule).
    """
    stats = queries.q_stats(session, traj.id, max_sample=m)
    ests = estimates(stats, traj.n_chunks, traj.outcome)
    queries.upsert_q_values(
        session,
        [
            {
                "trajectory_id": traj.id,
                "prefix_len": e.prefix_len,
                "n_samples": e.n_samples,
                "n_correct": e.n_correct,
                "q": e.q,
                "source": e.source,
            }
            for e in ests
        ],
    )
    q = complete_q(ests, traj.n_chunks, m)
    labelled = 0
    for r, rule in enumerate(rules):
        rows: list[dict[str, Any]] = []
        for chunk, label in zip(chunks, label_chunks(rule, q), strict=True):
            if label is None:
                continue
            before, after = q[chunk.idx - 1], q[chunk.idx]
            rows.append(
                {
                    "chunk_id": chunk.id,
                    "rule": rule.key,
                    "positive": label,
                    "q_before": before if before is not None else -1.0,
                    "q_after": after,
                }
            )
        queries.upsert_labels(session, rows)
        if r == 0:
            labelled = len(rows)
    return labelled
