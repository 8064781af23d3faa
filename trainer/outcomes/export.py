"""``stepq export outcomes``: every stored solution with its graded outcome, step by step.

A discriminative PRM learns step scores from outcome labels alone, so every solution the
queue has graded is a training example: each trajectory (its chunks, its outcome), and each
rollout (the trajectory's first k chunks, then the rollout's continuation split into steps,
its reward); ``OutcomeFilter`` says which are kept.  Rollouts outnumber trajectories by
M x chunks, so records are streamed in batches, never held at once.  JSON Lines, loadable
with ``datasets.load_dataset(DIR)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.workers.segmentation import SegmentationError, segment


def continuation_steps(text: str) -> list[str]:
    """A rollout's continuation as steps (the same splitters as trajectories; one step when
    none applies)."""
    if not text.strip():
        return []
    try:
        return list(segment(text, "auto").chunks)
    except SegmentationError:
        return [text]


@dataclass(frozen=True)
class OutcomeFilter:
    """Which graded solutions are examples.  The defaults are the outcome-supervised PRM
    paper's data rules where it states them: a response with no parseable answer is dropped
    (not counted as wrong: it says nothing about its steps' arithmetic, and a timed-out grade
    says nothing at all).  ``pass_rate=(0.2, 0.8)`` is the paper's problem filter (keep a
    problem only if that share of its rollouts is right); it is off by default because a set
    annotated with few rollouts per prefix gives noisy rates."""

    keep_unparseable: bool = False
    """stepq's option: keep them, as wrong."""
    pass_rate: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.pass_rate is not None:
            lo, hi = self.pass_rate
            if not 0.0 <= lo <= hi <= 1.0:
                raise ConfigError(f"pass-rate bounds must satisfy 0 <= low <= high <= 1 (got {lo}:{hi})")

    @classmethod
    def parse_pass_rate(cls, text: str | None) -> tuple[float, float] | None:
        """``"0.2:0.8"`` -> (0.2, 0.8)."""
        if not text:
            return None
        try:
            lo, hi = (float(x) for x in text.split(":"))
        except ValueError:
            raise ConfigError(f"--pass-rate takes LOW:HIGH, e.g. 0.2:0.8 (got '{text}')") from None
        return lo, hi

    def describe(self) -> str:
        """What the run's ``dataset`` name records (empty for the defaults)."""
        parts = (["unparseable-kept"] if self.keep_unparseable else []) + (
            [f"pass_rate={self.pass_rate[0]}-{self.pass_rate[1]}"] if self.pass_rate else []
        )
        return "".join(f":{p}" for p in parts)


def outcome_records(
    db: Database, set_name: str, *, batch: int = 5000, keep: OutcomeFilter = OutcomeFilter()
) -> Iterator[dict[str, Any]]:
    """Trajectories first, then rollouts (those whose text was kept), in id order."""
    with db.session() as session:
        trajectories = queries.scored_trajectories(session, set_name)
        ids = [t["id"] for t in trajectories]
        outcomes = queries.trajectory_outcomes(session, ids)
        counts = queries.rollout_pass_counts(session, ids) if keep.pass_rate else {}
    if keep.pass_rate:
        kept_problems = _problems_in_pass_rate(trajectories, counts, keep.pass_rate)
        trajectories = [t for t in trajectories if t["problem_id"] in kept_problems]
    chunks = {t["id"]: (t["question"], t["problem_id"], t["chunks"]) for t in trajectories}
    for t in trajectories:
        outcome = outcomes.get(t["id"])
        if outcome is None and not keep.keep_unparseable:
            continue
        yield {
            "prompt": t["question"],
            "steps": list(t["chunks"]),
            "outcome": bool(outcome),
            "source": "trajectory",
            "problem_id": t["problem_id"],
            "trajectory_id": t["id"],
            "prefix_len": len(t["chunks"]),
        }
    after = 0
    while True:
        with db.session() as session:
            rows = queries.rollout_texts(session, list(chunks), after_id=after, limit=batch)
        if not rows:
            return
        for rid, tid, k, body, reward, answer in rows:
            after = rid
            if answer is None and not keep.keep_unparseable:
                continue
            question, problem_id, own = chunks[tid]
            yield {
                "prompt": question,
                "steps": list(own[:k]) + continuation_steps(body),
                "outcome": bool(reward),
                "source": "rollout",
                "problem_id": problem_id,
                "trajectory_id": tid,
                "prefix_len": k,
            }


def _problems_in_pass_rate(
    trajectories: list[dict[str, Any]], counts: dict[int, tuple[int, int]], bounds: tuple[float, float]
) -> set[str]:
    """Problems whose rollouts (with a parseable answer, over all their trajectories) are
    right at a rate within ``bounds``; a problem with no graded rollout is left out."""
    per_problem: dict[str, list[int]] = {}
    for t in trajectories:
        right, n = counts.get(t["id"], (0, 0))
        tally = per_problem.setdefault(t["problem_id"], [0, 0])
        tally[0] += right
        tally[1] += n
    lo, hi = bounds
    return {p for p, (right, n) in per_problem.items() if n and lo <= right / n <= hi}


def export_outcomes(db: Database, set_name: str, out: Path, keep: OutcomeFilter = OutcomeFilter()) -> dict[str, int]:
    """Write ``train.jsonl`` under ``out``; returns how many records of each source."""
    counts = {"trajectory": 0, "rollout": 0}
    out.mkdir(parents=True, exist_ok=True)
    with (out / "train.jsonl").open("w") as f:
        for record in outcome_records(db, set_name, keep=keep):
            if not record["steps"]:
                continue
            f.write(json.dumps(record) + "\n")
            counts[record["source"]] += 1
    if not any(counts.values()):
        raise ConfigError(f"set '{set_name}' has no graded solutions to export yet")
    return counts
