"""Best-of-N: pick one of N policy samples by aggregating its step scores, and compare with
random choice and majority vote (pure functions, and samples of the synthetic policy; the
database's trajectories are read in ``validation.py``)."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

SOFTMIN_TEMPERATURE = 0.1
"""The PRM recipe's default tau; a Best-of-N pick by softmin uses it."""


def softmin(probabilities: Sequence[float], temperature: float = SOFTMIN_TEMPERATURE) -> float:
    """sigmoid(-tau * log((1/M) * sum_m exp(-r_m / tau))) with r_m the step logits: the PRM
    trainer's softmin (``stepq.trainer.prm.aggregate``) on scores given as probabilities."""
    eps = 1e-12
    logits = [math.log(max(p, eps)) - math.log(max(1.0 - p, eps)) for p in probabilities]
    low = min(logits)  # factored out so exp() cannot overflow at small tau
    mean = sum(math.exp(-(r - low) / temperature) for r in logits) / len(logits)
    value = low - temperature * math.log(mean)
    return 1.0 / (1.0 + math.exp(-value))


AGGREGATORS: dict[str, Callable[[Sequence[float]], float]] = {
    "min": min,
    "mean": lambda s: sum(s) / len(s),
    "product": math.prod,
    "geomean": lambda s: math.exp(sum(math.log(max(x, 1e-12)) for x in s) / len(s)),
    "last": lambda s: s[-1],
    "softmin": softmin,
}


def trained_aggregate(judge: Any) -> tuple[str, str]:
    """How Best-of-N aggregates a judge's step scores unless told: a stepq PRM as it was trained
    (an ORM, ``last``, ranks by its outcome score, as the outcome-supervised PRM paper ranks
    its baseline; ``asymmetric`` predicts with ``min``), any other judge by ``min``; and why."""
    trained = (getattr(getattr(judge, "scorer", None), "meta", None) or {}).get("aggregate")
    if trained is None:
        return "min", "default"
    from stepq.trainer.prm.aggregate import PREDICTED_BY

    how = PREDICTED_BY.get(str(trained), str(trained))
    if how not in AGGREGATORS:
        return "min", f"default (the PRM's training aggregate '{trained}' does not rank solutions)"
    return how, f"the PRM's training aggregate ({trained})"


@dataclass(frozen=True)
class Candidate:
    """One policy sample of a problem: its steps, final answer and whether that is right."""

    steps: tuple[str, ...]
    answer: str | None
    correct: bool


def aggregate(scores: Sequence[float], how: str) -> float:
    """One number per solution from its step scores (an empty solution scores 0)."""
    return AGGREGATORS[how](scores) if scores else 0.0


def pick(scores: Sequence[Sequence[float]], how: str) -> int:
    """Index of the best-scoring candidate; ties go to the earliest (a fixed, fair rule)."""
    values = [aggregate(s, how) for s in scores]
    return values.index(max(values))


PICKS = ("best", "weighted-vote")
"""How Best-of-N chooses among the N: ``best``, the sample whose aggregated step score is the
highest (the method Best-of-N names); ``weighted-vote``, the answer whose samples' aggregated
scores sum highest (majority vote with each sample weighted by the judge), a named option."""


def weighted_vote(candidates: Sequence[Candidate], values: Sequence[float]) -> bool:
    """Whether the answer with the largest sum of its samples' aggregated scores is right (ties:
    the answer seen first; no sample with an answer: the first sample).  A judge that misses
    an error now and then lets one wrong sample outscore the right ones, and the more samples
    the likelier; a vote needs several of them to agree."""
    totals: dict[str, float] = {}
    for c, value in zip(candidates, values, strict=True):
        if c.answer is not None:
            totals[c.answer] = totals.get(c.answer, 0.0) + value
    if not totals:
        return candidates[0].correct
    best = max(totals.values())
    winner = next(a for a, total in totals.items() if total == best)
    return next(c.correct for c in candidates if c.answer == winner)


def majority(candidates: Sequence[Candidate]) -> bool:
    """Whether the most common final answer is right (ties: the answer seen first)."""
    answers = [c.answer for c in candidates if c.answer is not None]
    if not answers:
        return candidates[0].correct
    counts = Counter(answers)
    top = max(counts.values())
    winner = next(a for a in answers if counts[a] == top)
    return next(c.correct for c in candidates if c.answer == winner)


@dataclass(frozen=True)
class BestOfNRow:
    """Accuracies (%) at one N over the ``problems`` that have N samples; with none, the
    accuracies are None (the row is still reported: every N asked gets its line)."""

    n: int
    judge: float | None
    random: float | None
    majority: float | None
    problems: int = 0
    per_problem: dict[str, list[float]] = field(default_factory=dict)
    """Each method's result on each usable problem, in order (1/0; random: its expectation), so
    differences can be paired and given intervals over problems."""


def best_of_n(
    problems: Sequence[Sequence[Candidate]],
    scores: Sequence[Sequence[Sequence[float]]],
    ns: Sequence[int],
    how: str,
    choose: str = "best",
) -> list[BestOfNRow]:
    """Accuracy (%) at each N of: the judge's choice among the first N samples (``choose``, one
    of ``PICKS``), random choice (its exact expectation: the share of right samples), and
    majority vote."""
    if how not in AGGREGATORS:
        raise ValueError(f"unknown aggregation {how!r} (one of: {', '.join(AGGREGATORS)})")
    if choose not in PICKS:
        raise ValueError(f"unknown pick {choose!r} (one of: {', '.join(PICKS)})")

    def judged(c: Sequence[Candidate], s: Sequence[Sequence[float]]) -> bool:
        if choose == "weighted-vote":
            return weighted_vote(c, [aggregate(x, how) for x in s])
        return c[pick(s, how)].correct

    rows = []
    for n in ns:
        usable = [(c[:n], s[:n]) for c, s in zip(problems, scores, strict=True) if len(c) >= n]
        if not usable:
            rows.append(BestOfNRow(n, None, None, None, 0))
            continue
        per = {
            "judge": [float(judged(c, s)) for c, s in usable],
            "random": [sum(x.correct for x in c) / n for c, _ in usable],
            "majority": [float(majority(c)) for c, _ in usable],
        }
        k = len(usable)
        share = {name: 100.0 * sum(v) / k for name, v in per.items()}
        rows.append(BestOfNRow(n, share["judge"], share["random"], share["majority"], k, per))
    return rows


def synthetic_candidates(
    problems: int, n: int, seed: int = 0, error_rate: float = 0.3, recovery_rate: float = 0.0
) -> list[tuple[str, list[Candidate]]]:
    """N samples of the synthetic policy for each of ``problems`` problems (question, samples)."""
    from stepq.workers.backends.synthetic_policy import SyntheticPolicy, make_problem
    from stepq.workers.seeds import derive_seed

    policy = SyntheticPolicy(error_rate=error_rate, recovery_rate=recovery_rate)
    rng = random.Random(seed)
    out = []
    for i in range(problems):
        problem = make_problem(derive_seed("bon-problem", seed, i))
        cands = []
        for _ in range(n):
            steps = policy.solve(problem, rng.getrandbits(31))
            cands.append(
                Candidate(tuple(s.text for s in steps), str(steps[-1].value), steps[-1].value == problem.answer)
            )
        out.append((problem.question, cands))
    return out
