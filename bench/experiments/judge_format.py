"""What the benchmark judges are asked and how they answer: the compact prompt, the analysis
formats a verdict may follow, and the synthetic truth of a judged step.  Pure functions of text;
the GRPO benchmark and the supervised capacity check both read them, so both judges answer in
one format.

Analyses (StepWiser's judge writes "1. Analysis ... 2. Final Judgment", here in miniature):

- ``none``: the verdict alone;
- ``recompute``: the judged step's own arithmetic, redone (``45 - 7 = 38``), then the verdict,
  so the verdict compares two numbers the judge has written side by side;
- ``resolve``: the problem re-solved, correctly, up to the judged step, then the verdict;
- ``compact``: the judged step's arithmetic redone in another spelling (``45-7=38``, no spaces),
  then the verdict.  ``recompute`` judges were seen copying the step's claimed result instead
  of computing it: after ``45 - 7 = `` the prompt already shows what follows.  No text in the
  prompt continues ``45-7=``, so the answer must be computed; the backbone learns that
  spelling in pretraining from arithmetic drills (``drill_lines``), never from a judged step;
- ``compare``: ``compact``, then the step's own claimed result beside it (``45-7=38 vs 37``),
  so the verdict compares two numbers written side by side.  Measured 2026-11-26: ``compact``
  judges computed 99-100% of held-out steps right, yet their verdicts followed their own
  analysis about half the time: the comparison with a claim far back in the prompt, not the
  arithmetic, was what they could not learn.
- ``spelled``: ``compare``, then the two numbers compared digit by digit, right-aligned, each
  pair marked ``=`` or ``#`` (``45-7=38 vs 37`` then ``3=3 8#7``): each mark compares two
  characters written side by side, and the verdict only has to see whether a ``#`` was written.
  Measured 2026-11-27: taught the step's own truth, where the verdict is exactly the equality of
  the two numbers, a ``compare`` judge (2 layers of one head) still did not learn it, on its own
  training rows either (P(Positive) 0.72 on Positive rows, 0.59 on Negative ones).
- ``chain``: the running value recomputed from the problem in the compact spelling, one line a
  step up to the judged one, the step's claim beside the last, and the digits spelled as in
  ``spelled`` (``45-7=38`` newline ``38+3=41 vs 40`` newline ``4=4 1#0``): the check of the step
  *and every step before it*, the truth that Monte Carlo labels follow (a step computing right
  from a wrong value leaves the solution wrong).  Measured 2026-11-27: a quarter of the
  first-dead rows come after a wrong step, where the one-step analyses and the labels disagree
  by construction.  Its judge (2 layers) wrote its own last value as the claim (``65+4=69 vs
  69`` for a step claiming 71), so its marks never differed.  Measured 2026-12-07: 4 layers
  deep and taught check rows beside the labels (``judge_check_rows``), its judges write the
  chain right on 93-100% of held-out steps and their verdicts follow their marks
  (docs/experiments/judge_at_work.md, "A check that reads the history").

The analysis is always the correct computation; it carries no verdict.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

JUDGE_TEMPLATE = "{problem}\n{history}\n>> {chunk}\nVerdict:"
ANALYSES = ("none", "recompute", "resolve", "compact", "compare", "spelled", "chain")
DRILLED = ("compact", "compare", "spelled", "chain")
"""The analyses in the compact spelling, which the backbone learns from drills in pretraining."""
EQUATION = re.compile(r"Step \d+: (-?\d+) ([+*-]) (\d+) = (-?\d+)\.")
APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
"""Each operation a step writes, computed right (``judge_reading`` checks a judge's own sum by it)."""


def judge_prompt(problem: str, history: Sequence[str], chunk: str) -> str:
    """The benchmark's prompt, rendered as ``stepq``'s ``JudgePrompt`` renders a template."""
    from stepq.trainer.generative_judge.prompt import JudgePrompt

    return JudgePrompt(JUDGE_TEMPLATE).render(problem, history, chunk)


def _recomputed(chunk: str) -> tuple[int, str, int, int, str] | None:
    """The judged step's operands, its operation computed right, and the result it claims."""
    m = EQUATION.search(chunk)
    if not m:
        return None
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return a, op, b, APPLY[op](a, b), m.group(4)


def recomputed_analysis(chunk: str) -> str:
    """The judged step's operation computed right, from the operands the step itself shows."""
    parts = _recomputed(chunk)
    return f"{parts[0]} {parts[1]} {parts[2]} = {parts[3]}" if parts else ""


def compact_analysis(chunk: str) -> str:
    """``recomputed_analysis`` without spaces: a spelling the judged step never shows."""
    return recomputed_analysis(chunk).replace(" ", "")


def compared_analysis(chunk: str) -> str:
    """``compact_analysis`` and the result the step claims, side by side."""
    m = EQUATION.search(chunk)
    return f"{compact_analysis(chunk)} vs {m.group(4)}" if m else ""


def chained_analysis(problem: str, chunk: str) -> str:
    """The true running value up to the judged step (from the problem, not from the steps
    shown), in the compact spelling, and the step's claim beside the last line."""
    from stepq.workers.backends.synthetic_policy import parse_problem

    m = EQUATION.search(chunk)
    step = re.match(r"Step (\d+):", chunk)
    if not m or not step:
        return ""
    parsed = parse_problem(f"Problem: {problem}")
    k = int(step.group(1))
    values = [parsed.start, *parsed.true_values()[:k]]
    symbols = {"Add": "+", "Subtract": "-", "Multiply by": "*"}
    lines = [f"{v}{symbols[name]}{x}={w}" for (name, x), v, w in zip(parsed.ops[:k], values, values[1:], strict=False)]
    value = values[-1]
    return "\n".join(lines) + f" vs {m.group(4)}\n" + spelled_digits(str(value), m.group(4))


def spelled_digits(computed: str, claimed: str) -> str:
    """The two numbers digit by digit, right-aligned (``_`` where one is shorter), each pair
    marked ``=`` or ``#``: ``spelled_digits("38", "37") == "3=3 8#7"``."""
    width = max(len(computed), len(claimed))
    a, b = computed.rjust(width, "_"), claimed.rjust(width, "_")
    return " ".join(f"{x}{'=' if x == y else '#'}{y}" for x, y in zip(a, b, strict=True))


def spelled_analysis(chunk: str) -> str:
    """``compared_analysis`` and its digits spelled out."""
    parts = _recomputed(chunk)
    return f"{compared_analysis(chunk)}\n{spelled_digits(str(parts[3]), parts[4])}" if parts else ""


def drill_lines(rng: random.Random, count: int, low: int = -20, high: int = 100) -> str:
    """``count`` sums and differences in the compact spelling, one a line (``45-7=38``): the
    operands of the small-number sets' steps (a running value, a one-digit operand), right."""
    lines = []
    for _ in range(count):
        a, op, b = rng.randint(low, high), rng.choice("+-"), rng.randint(1, 9)
        lines.append(f"{a}{op}{b}={APPLY[op](a, b)}")
    return "\n".join(lines)


def resolved_analysis(problem: str, steps: int) -> str:
    """The problem re-solved, correctly, up to the judged step (the equations a model
    pretrained on solutions writes anyway)."""
    from stepq.workers.backends.synthetic_policy import SyntheticPolicy, parse_problem

    problem_ = parse_problem(f"Problem: {problem}")
    correct = SyntheticPolicy(error_rate=0.0, recovery_rate=0.0).solve(problem_, 0)
    return "\n".join(EQUATION.search(s.text).group(0) for s in correct[:steps])  # type: ignore[union-attr]


def analysis_text(row: Mapping[str, Any], analysis: str) -> str:
    if analysis == "recompute":
        return recomputed_analysis(row["chunk"])
    if analysis == "compact":
        return compact_analysis(row["chunk"])
    if analysis == "compare":
        return compared_analysis(row["chunk"])
    if analysis == "spelled":
        return spelled_analysis(row["chunk"])
    if analysis == "chain":
        return chained_analysis(row["problem"], row["chunk"])
    if analysis == "resolve":
        return resolved_analysis(row["problem"], len(row["history"]) + 1)
    raise ValueError(f"unknown analysis {analysis!r}; one of {ANALYSES}")


def judge_answer(row: Mapping[str, Any], verdict: str, analysis: str) -> str:
    """The whole answer the format stage (and the supervised check) teaches for ``row``."""
    if analysis == "none":
        return f" \\boxed{{{verdict}}}"
    return f" Analysis:\n{analysis_text(row, analysis)}\n\\boxed{{{verdict}}}"


def step_local_truth(row: Mapping[str, Any]) -> bool:
    """Whether the judged step itself is right, from the value the step before it wrote: the
    truth up to a solution's first wrong step, which is all ProcessBench scores; after it, a
    step computing right from a wrong value is locally right (and not ``step_truth``)."""
    from stepq.workers.backends.synthetic_policy import step_locally_right

    right = step_locally_right(row["problem"], row["history"], row["chunk"])
    if right is None:
        raise ValueError("not a synthetic step: no truth to compare with")
    return right


def row_local_truth(row: Mapping[str, Any]) -> bool:
    """The row's ``local`` truth where its preparation stored one (a model's rows, whose steps
    the checker may not read), else ``step_local_truth``."""
    return bool(row["local"]) if "local" in row else step_local_truth(row)


def step_truth(row: Mapping[str, Any]) -> bool:
    """Whether the judged step and every step before it are right (the synthetic truth)."""
    from stepq.workers.backends.synthetic_policy import step_is_right

    right = step_is_right(row["problem"], row["history"], row["chunk"])
    if right is None:
        raise ValueError("not a synthetic step: no truth to compare with")
    return right
