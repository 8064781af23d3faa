"""``stepq export outcomes``: every stored solution with its graded outcome, step by step.

A discriminative PRM learns step scores from outcome labels alone, so every solution the
queue has graded is a training example: each trajectory (its chunks, its outcome), and each
rollout (the trajectory's first k chunks, then the rollout's continuation split into steps,
its reward).  Rollouts outnumber trajectories by M x chunks, so records are streamed in
batches, never held at once.  JSON Lines, loadable with ``datasets.load_dataset(DIR)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stepq.models import Database
from stepq.models import training_queries as tq
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


def outcome_records(db: Database, set_name: str, *, batch: int = 5000) -> Iterator[dict[str, Any]]:
    """Trajectories first, then rollouts (those whose text was kept), in id order."""
    with db.session() as session:
        trajectories = tq.scored_trajectories(session, set_name)
        outcomes = tq.trajectory_outcomes(session, [t["id"] for t in trajectories])
    chunks = {t["id"]: (t["question"], t["problem_id"], t["chunks"]) for t in trajectories}
    for t in trajectories:
        yield {
            "prompt": t["question"],
            "steps": list(t["chunks"]),
            "outcome": bool(outcomes.get(t["id"])),
            "source": "trajectory",
            "problem_id": t["problem_id"],
            "trajectory_id": t["id"],
            "prefix_len": len(t["chunks"]),
        }
    after = 0
    while True:
        with db.session() as session:
            rows = tq.rollout_texts(session, list(chunks), after_id=after, limit=batch)
        if not rows:
            return
        for rid, tid, k, body, reward in rows:
            after = rid
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


def export_outcomes(db: Database, set_name: str, out: Path) -> dict[str, int]:
    """Write ``train.jsonl`` under ``out``; returns how many records of each source."""
    counts = {"trajectory": 0, "rollout": 0}
    out.mkdir(parents=True, exist_ok=True)
    with (out / "train.jsonl").open("w") as f:
        for record in outcome_records(db, set_name):
            if not record["steps"]:
                continue
            f.write(json.dumps(record) + "\n")
            counts[record["source"]] += 1
    if not any(counts.values()):
        raise ConfigError(f"set '{set_name}' has no graded solutions to export yet")
    return counts
