"""Rows that teach a judge its check where copying the step's claim does not pay.

The judges of ``docs/experiments/judge_at_work.md`` that miss write the right sum on right
steps and, on new wrong steps, another number: the step's own claim back on 37-46% of them.  On
right steps the claim *is* the sum, and a snapshot's wrong steps are few enough to be learnt by
heart.  The spelled check
is a program's (``judge_format``), so it can be taught on steps no one labelled: fresh problems
solved right, one step each, its claimed result changed by 1-9 on half of them (the size of the
policies' own slips).  On those rows the claim is the sum only half the time.

A deviation from the label-taught recipe, named where it is used (``bench_judge_capacity
--check-rows``): these rows' verdicts are not Monte Carlo labels but what the check's own marks
say (Negative where a digit differs).  On them that is also the step's local truth, since the
history is right and only the claim is changed.  Pure functions of seeds and text.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from typing import Any

from bench.experiments.judge_format import EQUATION

ROWS_TAG = "judge-check-rows"
"""The seed tag of the check rows' problems and draws: one no other set uses."""

SLIPS = ("1-9", "tens-too")
"""How the altered rows' claims are moved: ``1-9``, by 1-9 either sign (the recipe of every
check-row run documented before the tens-digit test); ``tens-too``, every other altered row moved
by 10 instead, so that its claim is wrong in the tens digit alone, the neural policy's commonest
slip (``--check-slips``, a named deviation: no ``1-9`` row has such a claim)."""


def altered_chunk(chunk: str, delta: int) -> str:
    """``chunk`` with its claimed result moved by ``delta`` (and its final answer, where the step
    gives one, moved with it: the step still reads as one claim)."""
    m = EQUATION.search(chunk)
    if m is None:
        raise ValueError(f"not a step the check reads: {chunk!r}")
    claim = int(m.group(4))
    new = claim + delta
    head = chunk[: m.start(4)] + str(new) + chunk[m.end(4) :]
    return head.replace(f"\\boxed{{{claim}}}", f"\\boxed{{{new}}}")


def _claim(chunk: str) -> int:
    """The result a step claims."""
    m = EQUATION.search(chunk)
    assert m is not None  # the synthetic policy's own steps
    return int(m.group(4))


def check_rows(seed: int, count: int, exclude: Collection[str] = (), slips: str = "1-9") -> list[dict[str, Any]]:
    """``count`` judged steps of fresh small-number problems (none of ``exclude``), each solved
    right up to a step drawn at random, whose claim is changed by 1-9 (either sign) on every
    other row (``slips``: see ``SLIPS``); each row carries ``local``: whether its step is right
    (``row_local_truth`` reads it).  The same seed gives the same rows; ``tens-too`` gives the
    same problems, steps and signs, with every other altered claim moved by 10 instead."""
    if slips not in SLIPS:
        raise ValueError(f"check-row slips {slips!r}: not one of {', '.join(SLIPS)}")
    from stepq.workers.backends.synthetic_policy import SyntheticPolicy, make_problem
    from stepq.workers.data.synthetic_set import NUMBERS
    from stepq.workers.seeds import derive_seed

    policy = SyntheticPolicy(error_rate=0.0, recovery_rate=0.0)
    rng = random.Random(derive_seed(ROWS_TAG, seed))
    rows: list[dict[str, Any]] = []
    i = 0
    while len(rows) < count:
        problem = make_problem(derive_seed(ROWS_TAG, seed, i), numbers=NUMBERS["small"])
        i += 1
        if problem.question in exclude:
            continue
        steps = [s.text for s in policy.solve(problem, i)]
        k = rng.randrange(len(steps))
        altered = len(rows) % 2 == 1
        chunk = steps[k]
        if altered:
            delta = rng.choice([-1, 1]) * rng.randint(1, 9)  # drawn in every mode: one stream of draws
            if slips == "tens-too" and len(rows) % 4 == 3:
                delta = 10 if delta > 0 or _claim(chunk) < 10 else -10
            chunk = altered_chunk(chunk, delta)
        rows.append({"problem": problem.question, "history": steps[:k], "chunk": chunk, "local": not altered})
    return rows
