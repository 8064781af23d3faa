"""``stepq export outcomes``: graded solutions with their outcomes, step by step.

A discriminative PRM learns step scores from outcome labels alone.  By default the examples
are what the outcome-supervised PRM paper trains on: the policy's responses to the question
(each trajectory, and each rollout sampled from the problem alone, prefix 0), with no
parseable answer dropped, of the questions whose responses are right 20% to 80% of the time.
Rollouts from later prefixes (the trajectory's first k chunks, then the continuation split
into steps) are stepq's option (``prefix_rollouts``): many more examples, each sharing its
first k steps with its trajectory.  Rollouts outnumber trajectories by M x chunks, so records
are streamed in batches, never held at once.  JSON Lines, loadable with
``datasets.load_dataset(DIR)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.workers.data.segmentation import SegmentationError, segment

PAPER_PASS_RATE = (0.2, 0.8)
"""Questions kept by the paper: "the correct percentage of the rollout model's responses
[is] between 20 and 80 percent"."""


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
    """Which graded solutions are examples; the defaults are the outcome-supervised PRM
    paper's data: responses to the question only, no parseable answer dropped (not counted as
    wrong: it says nothing about its steps' arithmetic, and a timed-out grade says nothing at
    all), questions with a pass rate in [0.2, 0.8] over those responses."""

    keep_unparseable: bool = False
    """stepq's option: keep them, as wrong."""
    pass_rate: tuple[float, float] | None = PAPER_PASS_RATE
    """Keep a question only if this share of its responses (trajectories and prefix-0
    rollouts with a parseable answer) is right; None keeps every question."""
    prefix_rollouts: bool = False
    """stepq's option: rollouts from every prefix as extra solutions (the pass rate still
    counts the question's own responses only)."""

    def __post_init__(self) -> None:
        if self.pass_rate is not None:
            lo, hi = self.pass_rate
            if not 0.0 <= lo <= hi <= 1.0:
                raise ConfigError(f"pass-rate bounds must satisfy 0 <= low <= high <= 1 (got {lo}:{hi})")

    @classmethod
    def parse_pass_rate(cls, text: str | None) -> tuple[float, float] | None:
        """``"0.2:0.8"`` -> (0.2, 0.8); ``"off"`` -> None (every question); None -> the paper's."""
        if text is None:
            return PAPER_PASS_RATE
        if text.strip().lower() == "off":
            return None
        try:
            lo, hi = (float(x) for x in text.split(":"))
        except ValueError:
            raise ConfigError(f"--pass-rate takes LOW:HIGH, e.g. 0.2:0.8, or off (got '{text}')") from None
        return lo, hi

    def describe(self) -> str:
        """What the run's ``dataset`` name records (empty for the defaults)."""
        parts = ["unparseable-kept"] if self.keep_unparseable else []
        if self.pass_rate != PAPER_PASS_RATE:
            parts.append(
                "pass_rate=off" if self.pass_rate is None else f"pass_rate={self.pass_rate[0]}-{self.pass_rate[1]}"
            )
        parts += ["prefix-rollouts"] if self.prefix_rollouts else []
        return "".join(f":{p}" for p in parts)


def outcome_records(
    db: Database, set_name: str, *, batch: int = 5000, keep: OutcomeFilter = OutcomeFilter()
) -> Iterator[dict[str, Any]]:
    """Trajectories first, then rollouts (those whose text was kept), in id order."""
    with db.session() as session:
        trajectories = queries.scored_trajectories(session, set_name)
        ids = [t["id"] for t in trajectories]
        outcomes = queries.trajectory_outcomes(session, ids)
        counts = queries.rollout_pass_counts(session, ids, from_problem_only=True) if keep.pass_rate else {}
    if keep.pass_rate:
        kept_problems = problems_in_pass_rate(trajectories, outcomes, counts, keep.pass_rate)
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
            rows = queries.rollout_texts(
                session, list(chunks), after_id=after, limit=batch, from_problem_only=not keep.prefix_rollouts
            )
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


def problems_in_pass_rate(
    trajectories: list[dict[str, Any]],
    outcomes: dict[int, bool | None],
    counts: dict[int, tuple[int, int]],
    bounds: tuple[float, float],
) -> set[str]:
    """Problems whose responses to the question (their trajectories and the rollouts from
    prefix 0, each with a parseable answer) are right at a rate within ``bounds``; a problem
    with no graded response is left out."""
    per_problem: dict[str, list[int]] = {}
    for t in trajectories:
        right, n = counts.get(t["id"], (0, 0))
        outcome = outcomes.get(t["id"])
        tally = per_problem.setdefault(t["problem_id"], [0, 0])
        tally[0] += right + bool(outcome)
        tally[1] += n + (outcome is not None)
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
        within = (
            f" of a question whose responses are right {keep.pass_rate[0]:.0%}-{keep.pass_rate[1]:.0%} of the time "
            "(--pass-rate off keeps every question)"
            if keep.pass_rate
            else ""
        )
        raise ConfigError(f"set '{set_name}' has no graded solutions{within} to export yet")
    return counts
