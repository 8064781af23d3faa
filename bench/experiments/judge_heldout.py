"""The held-out side of the judge experiments: synthetic ProcessBench files written from the
synthetic policy's step truth, and judges' scores by step position on them (the statistics
are ``stats``).  Pure functions of their inputs and a seed."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def by_position(
    samples: Sequence[dict[str, Any]], scores: Sequence[float], keys: Sequence[tuple[int, bool]]
) -> dict[str, list[float | None]]:
    """Mean P(Positive) by step position, for the held-out file's correct steps (no error
    before them) and its first wrong steps: a judge that checks steps separates the two rows
    at every position; one that learned where errors tend to be moves both rows together."""
    depth = max(len(s["steps"]) for s in samples)
    sums = {kind: [[0.0, 0] for _ in range(depth)] for kind in ("correct", "first_error")}
    for (k, wrong), p in zip(keys, scores, strict=True):
        cell = sums["first_error" if wrong else "correct"][k]
        cell[0] += p
        cell[1] += 1
    return {kind: [round(t / n, 3) if n else None for t, n in cells] for kind, cells in sums.items()}


def position_items(samples: Sequence[dict[str, Any]]) -> tuple[list[Any], list[tuple[int, bool]]]:
    """Every held-out step up to the first wrong one, with (position, whether it is the first wrong)."""
    from stepq.trainer.evaluation.judges import StepItem

    items, keys = [], []
    for s in samples:
        last = s["label"] if s["label"] >= 0 else len(s["steps"]) - 1
        for k in range(last + 1):
            items.append(StepItem(s["problem"], tuple(s["steps"][:k]), s["steps"][k]))
            keys.append((k, k == s["label"]))
    return items, keys


def write_processbench(
    path: Path, problems: int, seed: int, policy: Any, exclude: frozenset[str] = frozenset(), numbers: str = "default"
) -> list[dict[str, Any]]:
    """Held-out samples: fresh problems (another seed tag; none whose question is in
    ``exclude``, the annotated set's), one solution each, the label the first step the
    synthetic truth says is wrong (-1 if none)."""
    from stepq.workers.backends.synthetic_policy import ground_truth, make_problem
    from stepq.workers.data.synthetic_set import NUMBERS
    from stepq.workers.seeds import derive_seed

    samples = []
    for i in itertools.count():
        if len(samples) == problems:
            break
        problem = make_problem(derive_seed("judge-grpo-heldout", seed, i), numbers=NUMBERS[numbers])
        if problem.question in exclude:
            continue
        steps = policy.solve(problem, derive_seed("judge-grpo-heldout-solution", seed, i))
        truth = ground_truth(steps)
        label = next((k for k, ok in enumerate(truth) if not ok), -1)
        samples.append({"id": f"s{i}", "problem": problem.question, "steps": [s.text for s in steps], "label": label})
    path.write_text(json.dumps(samples))
    return samples
