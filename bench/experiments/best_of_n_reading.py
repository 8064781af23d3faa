"""Why a judge's Best-of-N pick is wrong: read off the step scores the pick was made from.

``judge_own_policy`` scores every step of every held-out sample once (``set_step_scores``, what
``stepq eval best-of-n`` scores); this module reads those scores beside the synthetic truth's
(the oracle's 1/0 per step) and says, for the problems whose pick is wrong, what went wrong:

- **tied**: a right sample scored as high as the pick, which won on the tie rule (the earliest);
- **saturated**: the pick's lowest step P(Positive) is exactly 1.0 (the judge's probability has
  run out of digits, so the ranking among such samples is the tie rule's);
- **missed**: the judge accepts (P(Positive) >= 0.5) the pick's first wrong step (the truth
  rejects every step from there on; a later step the judge rejects does not undo the miss);
- **outscored**: the judge rejects that step, yet every right sample has a step it scores
  lower still (a right sample's weakest step, not the wrong sample's error, decides).

Beside the pick by the lowest step P(Positive) (the method the issue measures), two other picks
from the same scores, named as readings, not as the method: the first sample whose every step
the judge accepts (its verdicts, read as P(Positive) >= 0.5), and a vote weighted by each
sample's lowest step P(Positive) (``stepq eval best-of-n --pick weighted-vote``).  Pure
functions: no model, no database; ``--scores`` reads again the scores that
``judge_own_policy --save-scores`` kept:

    python -m bench.experiments.best_of_n_reading --scores runs/scores0.json --n 4,16
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stepq.trainer.evaluation.best_of_n import BestOfNRow, aggregate, best_of_n, pick, weighted_vote

ACCEPTED = 0.5
"""A step the judge accepts: P(Positive) at least this (the verdict it writes if only the two
verdict words could follow its analysis)."""


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
    lowest = [aggregate(s, "min") for s in scores]
    chosen = pick(scores, "min")  # stepq eval best-of-n's own pick
    top = lowest[chosen]
    if candidates[chosen].correct:
        return None
    if any(c.correct and low == top for c, low in zip(candidates, lowest, strict=True)):
        return "tied"
    if top == 1.0:
        return "saturated"
    first_wrong = next((k for k, t in enumerate(truth[chosen]) if t < ACCEPTED), None)
    if first_wrong is not None and scores[chosen][first_wrong] >= ACCEPTED:
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
    samples (the share whose lowest step score is exactly 1.0, the share it accepts whole, the
    quartiles of their lowest step scores: where the two overlap, the top of N is drawn).
    ``per_problem``: each pick's result on each usable problem, in ``best_of_n``'s order, so
    that it pairs with majority vote's."""
    usable = [
        (c[:n], s[:n], t[:n]) for c, s, t in zip(problems, scores, truth, strict=True) if len(c) >= n
    ]  # fmt: skip
    reasons: dict[str, int] = {"tied": 0, "saturated": 0, "missed": 0, "outscored": 0}
    picks: dict[str, list[bool]] = {"lowest step P(Positive)": [], "first accepted": [], "weighted vote": []}
    kinds: dict[bool, dict[str, int]] = {flag: {"samples": 0, "saturated": 0, "accepted": 0} for flag in (True, False)}
    lowest: dict[bool, list[float]] = {True: [], False: []}
    for cands, sc, tr in usable:
        reason = why_wrong(cands, sc, tr)
        picks["lowest step P(Positive)"].append(reason is None)
        if reason is not None:
            reasons[reason] += 1
        picks["first accepted"].append(first_accepted(cands, sc))
        low = [aggregate(s, "min") for s in sc]
        picks["weighted vote"].append(weighted_vote(cands, low))
        for c, s, value in zip(cands, sc, low, strict=True):
            kind = kinds[bool(c.correct)]
            kind["samples"] += 1
            kind["saturated"] += value == 1.0
            kind["accepted"] += all(x >= ACCEPTED for x in s)
            lowest[bool(c.correct)].append(value)
    count = max(1, len(usable))

    def share(kind: dict[str, int], key: str) -> float:
        return 100.0 * kind[key] / max(1, kind["samples"])

    def quartiles(values: list[float]) -> list[float] | None:
        ordered = sorted(values)
        return [ordered[int(len(ordered) * q)] for q in (0.25, 0.5, 0.75)] if ordered else None

    def kind_of(flag: bool) -> dict[str, Any]:
        return {
            "saturated": share(kinds[flag], "saturated"),
            "accepted": share(kinds[flag], "accepted"),
            "lowest_quartiles": quartiles(lowest[flag]),
        }

    return {
        "n": n,
        "problems": len(usable),
        "accuracy": {name: 100.0 * sum(v) / count for name, v in picks.items()},
        "per_problem": picks,
        "wrong_picks": reasons,
        "right_samples": kind_of(True),
        "wrong_samples": kind_of(False),
    }


def read_rows(
    problems: Sequence[Sequence[Any]],
    scores: Sequence[Sequence[Sequence[float]]],
    truth: Sequence[Sequence[Sequence[float]]],
    by_judge: Sequence[BestOfNRow],
    seed: int,
) -> list[dict[str, Any]]:
    """``read_picks`` at each N of ``by_judge`` (``best_of_n`` on these scores by ``min``),
    with each pick's paired gain over majority vote (the vote ``stepq eval best-of-n``
    reports, on the same problems)."""
    from bench.experiments.bench_judge_at_work import paired_gain

    rows = []
    for row in by_judge:
        reading = read_picks(problems, scores, truth, row.n)
        assert reading["per_problem"]["lowest step P(Positive)"] == [bool(v) for v in row.per_problem["judge"]]
        majority = row.per_problem["majority"]
        rows.append(
            {
                **{k: v for k, v in reading.items() if k != "per_problem"},
                "over_majority": {
                    name: paired_gain(majority, values, seed) for name, values in reading["per_problem"].items()
                },
            }
        )
    return rows


def save_scores(path: Path, problems: Sequence[Sequence[Any]], scores: Any, truth: Any) -> None:
    """The samples (answer, right or not) with the judge's and the truth's step scores: what
    ``read_rows`` reads, kept so a reading can be redone without the judge (``--scores``)."""
    samples = [[{"answer": c.answer, "correct": c.correct} for c in cands] for cands in problems]
    path.write_text(json.dumps({"samples": samples, "scores": scores, "truth": truth}))


def load_scores(path: Path) -> tuple[list[list[Any]], list[Any], list[Any]]:
    from stepq.trainer.evaluation.best_of_n import Candidate

    saved = json.loads(path.read_text())
    problems = [[Candidate((), s["answer"], s["correct"]) for s in cands] for cands in saved["samples"]]
    return problems, saved["scores"], saved["truth"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scores", type=Path, nargs="+", required=True, help="judge_own_policy --save-scores files.")
    ap.add_argument("--n", default="4,16", help="Best-of-N sizes.")
    ap.add_argument("--seed", type=int, default=0, help="The bootstrap's seed.")
    args = ap.parse_args()
    ns = sorted({int(n) for n in args.n.split(",")})
    for path in args.scores:
        problems, scores, truth = load_scores(path)
        for row in read_rows(problems, scores, truth, best_of_n(problems, scores, ns, "min"), args.seed):
            print(f"{path}: {json.dumps(row)}")


if __name__ == "__main__":
    main()
