"""The evaluation statistics every learning experiment reports, in one place: bootstrap
intervals, rank AUC, balanced accuracy, the official ProcessBench F1 and its chance level, and
t-intervals over seeds.  Pure functions of their inputs and a seed."""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
"""Student's t, two-sided 95%, by degrees of freedom (more: 1.96)."""


def bootstrap(values: Sequence[Any], stat: Callable[[Sequence[Any]], float], seed: int, rounds: int = 1000) -> tuple:
    """95% percentile interval of ``stat`` over ``values`` resampled with replacement (resample
    the units that are independent: problems, not steps)."""
    rng = random.Random(seed)
    draws = sorted(stat([values[rng.randrange(len(values))] for _ in values]) for _ in range(rounds))
    return draws[int(0.025 * rounds)], draws[int(0.975 * rounds) - 1]


def mean_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval over seeds."""
    m = statistics.mean(values)
    if len(values) < 2:
        return m, m, m
    half = T_975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return m, m - half, m + half


def auc(positives: Sequence[float], negatives: Sequence[float], empty: float = float("nan")) -> float:
    """P(a positive's score > a negative's), ties counting half (Mann-Whitney); ``empty`` when
    either side has none."""
    if not positives or not negatives:
        return empty
    neg = sorted(negatives)
    wins = sum(
        bisect.bisect_left(neg, p) + 0.5 * (bisect.bisect_right(neg, p) - bisect.bisect_left(neg, p)) for p in positives
    )
    return wins / (len(positives) * len(neg))


def rank_auc(rows: Sequence[tuple[int, bool, float]]) -> float:
    """rows: (problem, label, score): the judge's P(Positive) as a ranking, whatever threshold
    its greedy verdict implies; 0.5 when a side is empty."""
    return auc([s for _, label, s in rows if label], [s for _, label, s in rows if not label], empty=0.5)


def balanced_accuracy(rows: Sequence[tuple[int, bool, bool | None]]) -> float:
    """rows: (problem, label, verdict); no verdict is wrong (as ``stepq eval snapshot`` scores it)."""
    by = {True: [0, 0], False: [0, 0]}
    for _, label, verdict in rows:
        by[label][0] += verdict is label
        by[label][1] += 1
    return 50.0 * sum(hit / n for hit, n in by.values() if n) if all(n for _, n in by.values()) else 0.0


def at_threshold(rows: Sequence[tuple[int, bool, float]], threshold: float) -> list[tuple[int, bool, bool]]:
    return [(pid, label, p >= threshold) for pid, label, p in rows]


def grouped(rows: Sequence[tuple], key: int = 0) -> list[list[tuple]]:
    """Rows grouped by ``key`` (the problem): the unit a bootstrap resamples."""
    groups: dict[Any, list[tuple]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r)
    return list(groups.values())


def processbench_f1(pairs: Sequence[tuple[int, int]]) -> float:
    """pairs: (label, prediction); the official metric (stepq's own scorer)."""
    from stepq.trainer.evaluation.processbench import score

    return score(
        "f", {str(i): lab for i, (lab, _) in enumerate(pairs)}, {str(i): p for i, (_, p) in enumerate(pairs)}
    ).f1


def random_guess_f1(samples: Sequence[dict[str, Any]], seed: int, draws: int = 200) -> float:
    """ProcessBench F1 of guessing each sample's first wrong step (or none) uniformly: chance."""
    rng = random.Random(seed)
    return statistics.mean(
        processbench_f1([(s["label"], rng.randrange(-1, len(s["steps"]))) for s in samples]) for _ in range(draws)
    )
