"""Why a judge's Best-of-N pick is wrong: read off the step scores the pick was made from.

``judge_own_policy`` scores every step of every held-out sample once (``set_step_scores``, what
``stepq eval best-of-n`` scores); this module reads those scores beside the synthetic truth's
(the oracle's 1/0 per step) and says, for the problems whose pick is wrong, what went wrong:

- **tied**: a right sample scored as high as the pick, which won on the tie rule (the earliest);
- **saturated**: the pick's lowest step P(Positive) is exactly 1.0 (the judge's probability has
  run out of digits, so the ranking among such samples is the tie rule's);
- **missed**: the pick has a step the truth rejects and the judge accepts (P(Positive) >= 0.5);
- **outscored**: otherwise, every right sample has a step scored lower than the pick's lowest.

Beside the pick by the lowest step P(Positive) (the method the issue measures), two other picks
from the same scores, named as readings, not as the method: the first sample whose every step
the judge accepts (its verdicts, read as P(Positive) >= 0.5), and a vote weighted by each
sample's lowest step P(Positive) (answers summed).  Pure functions: no model, no database.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

ACCEPTED = 0.5
"""A step the judge accepts: P(Positive) at least this (its greedy verdict, between two words)."""


def weighted_vote(candidates: Sequence[Any], lowest: Sequence[float]) -> bool:
    """Whether the answer with the largest sum of its samples' lowest step P(Positive) is right
    (ties: the answer seen first; no answer at all: the first sample)."""
    totals: dict[str, float] = defaultdict(float)
    order: list[str] = []
    for c, score in zip(candidates, lowest, strict=True):
        if c.answer is None:
            continue
        if c.answer not in totals:
            order.append(c.answer)
        totals[c.answer] += score
    if not order:
        return bool(candidates[0].correct)
    best = max(totals.values())
    winner = next(a for a in order if totals[a] == best)
    return next(bool(c.correct) for c in candidates if c.answer == winner)


def first_accepted(candidates: Sequence[Any], scores: Sequence[Sequence[float]]) -> bool:
    """Whether the first sample whose every step the judge accepts is right (none accepted:
    the sample with the most steps accepted before its first rejection, the earliest on ties)."""
    for c, s in zip(candidates, scores, strict=True):
        if all(x >= ACCEPTED for x in s):
            return bool(c.correct)

    def run(s: Sequence[float]) -> int:
        return next((k for k, x in enumerate(s) if x < ACCEPTED), len(s))

    runs = [run(s) for s in scores]
    return bool(candidates[runs.index(max(runs))].correct)


def why_wrong(
    candidates: Sequence[Any], scores: Sequence[Sequence[float]], truth: Sequence[Sequence[float]]
) -> str | None:
    """None where the pick (highest lowest step score, the earliest on ties) is right, else
    the first of: tied, saturated, missed, outscored (the module's docstring)."""
    lowest = [min(s) if s else 0.0 for s in scores]
    top = max(lowest)
    chosen = lowest.index(top)
    if candidates[chosen].correct:
        return None
    if any(c.correct and low == top for c, low in zip(candidates, lowest, strict=True)):
        return "tied"
    if top == 1.0:
        return "saturated"
    if any(t < ACCEPTED <= x for x, t in zip(scores[chosen], truth[chosen], strict=True)):
        return "missed"
    return "outscored"


def read_picks(
    problems: Sequence[Sequence[Any]],
    scores: Sequence[Sequence[Sequence[float]]],
    truth: Sequence[Sequence[Sequence[float]]],
    n: int,
) -> dict[str, Any]:
    """Over the problems with at least ``n`` samples (the first ``n`` of each): the share (%)
    right by the lowest-score pick, by first-accepted and by the weighted vote; why the
    lowest-score pick is wrong where it is (counts); and how the judge scores right and wrong
    samples (the share whose lowest step score is exactly 1.0, the share it accepts whole).
    ``per_problem``: each pick's result on each usable problem, in ``best_of_n``'s order, so
    that it pairs with majority vote's."""
    usable = [
        (c[:n], s[:n], t[:n]) for c, s, t in zip(problems, scores, truth, strict=True) if len(c) >= n
    ]  # fmt: skip
    reasons: dict[str, int] = {"tied": 0, "saturated": 0, "missed": 0, "outscored": 0}
    picks: dict[str, list[bool]] = {"lowest step P(Positive)": [], "first accepted": [], "weighted vote": []}
    kinds: dict[bool, dict[str, int]] = {flag: {"samples": 0, "saturated": 0, "accepted": 0} for flag in (True, False)}
    for cands, sc, tr in usable:
        reason = why_wrong(cands, sc, tr)
        picks["lowest step P(Positive)"].append(reason is None)
        if reason is not None:
            reasons[reason] += 1
        picks["first accepted"].append(first_accepted(cands, sc))
        picks["weighted vote"].append(weighted_vote(cands, [min(s) if s else 0.0 for s in sc]))
        for c, s in zip(cands, sc, strict=True):
            kind = kinds[bool(c.correct)]
            kind["samples"] += 1
            kind["saturated"] += bool(s) and min(s) == 1.0
            kind["accepted"] += all(x >= ACCEPTED for x in s)
    count = max(1, len(usable))

    def share(kind: dict[str, int], key: str) -> float:
        return 100.0 * kind[key] / max(1, kind["samples"])

    return {
        "n": n,
        "problems": len(usable),
        "accuracy": {name: 100.0 * sum(v) / count for name, v in picks.items()},
        "per_problem": picks,
        "wrong_picks": reasons,
        "right_samples": {"saturated": share(kinds[True], "saturated"), "accepted": share(kinds[True], "accepted")},
        "wrong_samples": {"saturated": share(kinds[False], "saturated"), "accepted": share(kinds[False], "accepted")},
    }
