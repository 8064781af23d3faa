"""The held-out side of the judge benchmarks: synthetic ProcessBench files written from the
synthetic policy's step truth, the official F1 and chance levels, balanced accuracy and rank AUC,
and 95% bootstrap intervals over problems.  Pure functions of their inputs and a seed."""

from __future__ import annotations

import bisect
import itertools
import json
import random
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def bootstrap(values: Sequence[Any], stat: Callable[[Sequence[Any]], float], seed: int, rounds: int = 1000) -> tuple:
    rng = random.Random(seed)
    draws = sorted(stat([values[rng.randrange(len(values))] for _ in values]) for _ in range(rounds))
    return draws[int(0.025 * rounds)], draws[int(0.975 * rounds) - 1]


def balanced_accuracy(rows: Sequence[tuple[int, bool, bool | None]]) -> float:
    """rows: (problem, label, verdict); no verdict is wrong (as ``stepq eval snapshot`` scores it)."""
    by = {True: [0, 0], False: [0, 0]}
    for _, label, verdict in rows:
        by[label][0] += verdict is label
        by[label][1] += 1
    return 50.0 * sum(hit / n for hit, n in by.values() if n) if all(n for _, n in by.values()) else 0.0


def rank_auc(rows: Sequence[tuple[int, bool, float]]) -> float:
    """P(a Positive-labelled chunk's score > a Negative one's), ties half: the judge's
    P(Positive) as a ranking, whatever threshold its greedy verdict implies."""
    pos = sorted(s for _, label, s in rows if label)
    neg = sorted(s for _, label, s in rows if not label)
    if not pos or not neg:
        return 0.5
    wins = sum(
        bisect.bisect_left(neg, p) + 0.5 * (bisect.bisect_right(neg, p) - bisect.bisect_left(neg, p)) for p in pos
    )
    return wins / (len(pos) * len(neg))


def at_threshold(rows: Sequence[tuple[int, bool, float]], threshold: float) -> list[tuple[int, bool, bool]]:
    return [(pid, label, p >= threshold) for pid, label, p in rows]


def grouped(rows: Sequence[tuple], key: int = 0) -> list[list[tuple]]:
    groups: dict[Any, list[tuple]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r)
    return list(groups.values())


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


def processbench_f1(pairs: Sequence[tuple[int, int]]) -> float:
    """pairs: (label, prediction); the official metric."""
    from stepq.trainer.evaluation.processbench import score

    return score(
        "f", {str(i): lab for i, (lab, _) in enumerate(pairs)}, {str(i): p for i, (_, p) in enumerate(pairs)}
    ).f1


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


def random_guess_f1(samples: Sequence[dict[str, Any]], seed: int, draws: int = 200) -> float:
    rng = random.Random(seed)
    return statistics.mean(
        processbench_f1([(s["label"], rng.randrange(-1, len(s["steps"]))) for s in samples]) for _ in range(draws)
    )
