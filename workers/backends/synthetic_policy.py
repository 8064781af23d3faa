"""A seeded synthetic arithmetic policy whose every step's correctness is known exactly.

Problems are chains of integer operations ("Start with 12. Add 7. Multiply by 3.").  The
policy writes one ``Step i: a op x = v.`` chunk per operation; each step is wrong with
probability ``error_rate`` (off by a small non-zero amount), errors carry to the final
``\\boxed{}`` answer, and once wrong a step recovers the true value with the small
probability ``recovery_rate``.  Continuations from any prefix follow the same rules, read
from the text itself, so this is a real text-in/text-out policy: the ground truth for
testing labels and the stand-in model for benchmarks (no weights are needed).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

PROMPT_TEMPLATE = (
    "Solve the problem step by step. Write each step as 'Step n: ...' on its own "
    "paragraph and give the final answer as \\boxed{{...}}.\n\n"
    "Problem: {question}\n\nSolution:\n"
)
_OPS = {"Add": "+", "Subtract": "-", "Multiply by": "*"}
_QUESTION = re.compile(
    r"Problem: (Start with (-?\d+)\.((?: (?:Add|Subtract|Multiply by) \d+\.)+) What is the result\?)"
)
_OP = re.compile(r"(Add|Subtract|Multiply by) (\d+)\.")
_STEP = re.compile(r"Step (\d+): (-?\d+) ([+*-]) (\d+) = (-?\d+)\.")
ERROR_KINDS = ("result", "operand", "operation", "carry")


@dataclass(frozen=True)
class ArithmeticProblem:
    start: int
    ops: tuple[tuple[str, int], ...]

    @property
    def question(self) -> str:
        body = " ".join(f"{name} {x}." for name, x in self.ops)
        return f"Start with {self.start}. {body} What is the result?"

    def true_values(self) -> list[int]:
        """The correct running value after each step."""
        values, v = [], self.start
        for name, x in self.ops:
            v = apply(name, v, x)
            values.append(v)
        return values

    @property
    def answer(self) -> int:
        return self.true_values()[-1]


def apply(name: str, value: int, x: int) -> int:
    if name == "Add":
        return value + x
    if name == "Subtract":
        return value - x
    return value * x


@dataclass(frozen=True)
class Numbers:
    """The numbers a problem is drawn from.  The default mixes multiplication into additions
    of up to 40; ``SMALL_NUMBERS`` keeps to one-digit additions to and subtractions from a
    two-digit start.  A step's own error is off by 1 to 9 in both, so (values staying
    positive) it always changes the last digit of what the step writes: one digit of
    arithmetic checks a step, which a model small enough to train on a CPU can learn."""

    start: tuple[int, int] = (2, 30)
    operand: tuple[int, int] = (1, 40)
    multiply: bool = True


DEFAULT_NUMBERS = Numbers()
SMALL_NUMBERS = Numbers(start=(30, 60), operand=(1, 9), multiply=False)


def make_problem(
    seed: int, min_steps: int = 3, max_steps: int = 8, numbers: Numbers = DEFAULT_NUMBERS
) -> ArithmeticProblem:
    rng = random.Random(seed)
    start = rng.randint(*numbers.start)
    ops: list[tuple[str, int]] = []
    v = start
    for _ in range(rng.randint(min_steps, max_steps)):
        can_multiply = numbers.multiply and abs(v) < 100
        name = rng.choice(["Add", "Subtract", "Multiply by"] if can_multiply else ["Add", "Subtract"])
        x = rng.randint(2, 5) if name == "Multiply by" else rng.randint(*numbers.operand)
        ops.append((name, x))
        v = apply(name, v, x)
    return ArithmeticProblem(start, tuple(ops))


def is_synthetic_question(question: str) -> bool:
    """Whether the synthetic policy can continue this problem (it only knows its own)."""
    return bool(_QUESTION.search(f"Problem: {question}"))


def parse_problem(prompt: str) -> ArithmeticProblem:
    """Read the problem back from a policy prompt (the backend sees only text)."""
    m = _QUESTION.search(prompt)
    if not m:
        raise ValueError("prompt holds no synthetic arithmetic problem")
    ops = tuple((name, int(x)) for name, x in _OP.findall(m.group(3)))
    return ArithmeticProblem(int(m.group(2)), ops)


@dataclass(frozen=True)
class Step:
    text: str
    value: int
    correct: bool  # this step's value equals the true running value
    slip: bool = False
    """A harmless error: the step shows a wrong operand but carries the right value, so the
    answer is unaffected (a process error that no rollout can see)."""


@dataclass(frozen=True)
class SyntheticPolicy:
    """A policy with what real chains of thought have: errors (a rate per operation, so steps
    of one solution differ in difficulty), self-correction (a wrong running value is set
    right with ``recovery_rate``), and harmless errors (``slip_rate``).  Its true Q-values
    stay exactly computable (``trajectory_q``)."""

    error_rate: float = 0.1
    recovery_rate: float = 0.001
    op_error_rates: tuple[tuple[str, float], ...] = ()
    """Per-operation error rates, e.g. (("Multiply by", 0.3),); others use ``error_rate``."""
    slip_rate: float = 0.0
    error_kinds: tuple[tuple[str, float], ...] = ()
    """What an error is, with weights, e.g. (("operand", 1.0), ("carry", 1.0)): ``result`` (the
    step's own arithmetic off by 1-9, the only kind when empty), ``operand`` (an operand copied
    from elsewhere in the problem, or off by 1-3, computed right), ``operation`` (add and
    subtract swapped, multiply added, computed right) or ``carry`` (the step starts from a value
    off by 1-9 from the one the step before wrote, computed right).  Only ``result`` is visible
    in the step alone; the others need the problem or the history.  The chance of an error, and
    so every Q-value, is the same whatever its kind."""
    step_separator: str = "\n\n"
    """What ends a step: a blank line (a paragraph a step), or ``"\n"`` (one line a step, as
    policies asked for "Step n:" lines write them: a blank line then cuts nothing)."""

    def error_rate_of(self, op: str) -> float:
        return dict(self.op_error_rates).get(op, self.error_rate)

    def continue_steps(self, problem: ArithmeticProblem, done: int, value: int, rng: random.Random) -> list[Step]:
        """Write steps ``done+1 .. n`` starting from running value ``value``."""
        truth = problem.true_values()
        steps: list[Step] = []
        n = len(problem.ops)
        for i in range(done, n):
            name, x = problem.ops[i]
            new = apply(name, value, x)
            written = None  # (start shown, operation, operand, result) of an error of another kind
            if value != (truth[i - 1] if i else problem.start) and rng.random() < self.recovery_rate:
                new = truth[i]
            elif rng.random() < self.error_rate_of(name):
                written = self._error(problem, i, value, truth[i], rng)
                if written is None:  # the step's own result off
                    delta = rng.choice([-1, 1]) * rng.randint(1, 9)
                    new += delta
                    if new == truth[i]:  # an error never lands on the truth by luck
                        new += delta
            slip = False
            if written is None:
                slip = self.slip_rate > 0 and rng.random() < self.slip_rate
                written = (value, name, x + rng.randint(1, 3) if slip else x, new)  # a slip: a wrong operand shown
            steps.append(self._step(problem, i, written, truth[i], slip))
            value = written[3]
        return steps

    def _error(
        self, problem: ArithmeticProblem, i: int, value: int, truth: int, rng: random.Random
    ) -> tuple[int, str, int, int] | None:
        """A step of a kind other than ``result``, as (start shown, operation, operand, result), or
        None for a ``result`` error.  With no kinds set no random number is drawn here, so the
        policy's draws are the same as before kinds existed.  An error never lands on the truth
        by luck: a draw that would is drawn again (a carry from a wrong value can)."""
        if not self.error_kinds:
            return None
        names, weights = zip(*self.error_kinds, strict=True)
        name, x = problem.ops[i]
        for _ in range(8):
            kind = rng.choices(names, weights)[0]
            if kind == "result":
                return None
            if kind == "operand":
                others = [y for _, y in problem.ops if y != x]
                shown_x = rng.choice(others) if others else x + rng.randint(1, 3)
                step = (value, name, shown_x, apply(name, value, shown_x))
            elif kind == "operation":
                swapped = {"Add": "Subtract", "Subtract": "Add", "Multiply by": "Add"}[name]
                step = (value, swapped, x, apply(swapped, value, x))
            elif kind == "carry":
                start = value + rng.choice([-1, 1]) * rng.randint(1, 9)
                step = (start, name, x, apply(name, start, x))
            else:
                raise ValueError(f"unknown error kind {kind!r} (one of: {', '.join(ERROR_KINDS)})")
            if step[3] != truth:
                return step
        return None

    def _step(
        self, problem: ArithmeticProblem, i: int, written: tuple[int, str, int, int], truth: int, slip: bool
    ) -> Step:
        """Step ``i`` as the policy writes it, the last with the final answer."""
        start, name, x, new = written
        text = f"Step {i + 1}: {start} {_OPS[name]} {x} = {new}."
        text += f"\nThe final answer is \\boxed{{{new}}}." if i == len(problem.ops) - 1 else self.step_separator
        return Step(text, new, new == truth, slip)

    def solve(self, problem: ArithmeticProblem, seed: int) -> list[Step]:
        return self.continue_steps(problem, 0, problem.start, random.Random(seed))

    def continue_text(self, prompt: str, prefix: str, seed: int) -> str:
        """Continue ``prefix`` (the assistant text so far) under the same rules."""
        problem = parse_problem(prompt)
        found = _STEP.findall(prefix)
        done = len(found)
        if done >= len(problem.ops):
            return ""
        value = int(found[-1][4]) if found else problem.start
        return "".join(s.text for s in self.continue_steps(problem, done, value, random.Random(seed)))


def step_is_right(question: str, history: Sequence[str], chunk: str) -> bool | None:
    """Whether ``chunk`` and every step before it compute the true running value (what the
    oracles judge by); None when the text holds no synthetic problem or step."""
    try:
        problem = parse_problem(f"Problem: {question}")
    except ValueError:
        return None
    if not _STEP.search(chunk):
        return None
    truth = problem.true_values()
    steps = _STEP.findall("".join(history) + chunk)
    return all(int(s[0]) <= len(truth) and int(s[4]) == truth[int(s[0]) - 1] for s in steps)


def step_locally_right(question: str, history: Sequence[str], chunk: str) -> bool | None:
    """Whether ``chunk`` itself is right: it starts from the value the step before it wrote
    (the problem's start for the first), applies the problem's operation, and writes the result.
    Up to a solution's first wrong step this is ``step_is_right``; after it, a step computing
    right from a wrong value is locally right and not right.  None for a non-synthetic text."""
    try:
        problem = parse_problem(f"Problem: {question}")
    except ValueError:
        return None
    m = _STEP.search(chunk)
    if not m:
        return None
    before = _STEP.findall("".join(history))
    i = int(m.group(1)) - 1
    if not 0 <= i < len(problem.ops) or i != len(before):
        return False
    start = int(before[-1][4]) if before else problem.start
    name, x = problem.ops[i]
    shown, op, operand, result = int(m.group(2)), m.group(3), int(m.group(4)), int(m.group(5))
    return shown == start and op == _OPS[name] and operand == x and result == apply(name, start, x)


def ground_truth(steps: Sequence[Step]) -> list[bool]:
    """Chunk i is right iff it and every chunk before it are error-free (a slip included)."""
    out, ok = [], True
    for s in steps:
        ok = ok and s.correct and not s.slip
        out.append(ok)
    return out


def exact_q(policy: SyntheticPolicy, remaining: int, correct_now: bool, ops: Sequence[str] | None = None) -> float:
    """The true Q of a prefix: chance of ending correct with ``remaining`` steps to write
    (the operations ``ops`` of those steps, when their error rates differ).

    The policy is a two-state chain: a correct running value stays correct with
    probability 1 - e (e the step's error rate); a wrong one becomes correct only by
    recovery (an error never lands on the truth, and a correct operation on a wrong value
    stays wrong).  Slips change no value, so they do not enter.
    """
    rates = [policy.error_rate_of(op) for op in ops] if ops is not None else [policy.error_rate] * remaining
    r = policy.recovery_rate
    p_correct, p_wrong = 1.0, 0.0
    for e in reversed(rates):  # from the last step back to the next one
        p_correct, p_wrong = (1 - e) * p_correct + e * p_wrong, r * p_correct + (1 - r) * p_wrong
    return p_correct if correct_now else p_wrong


def trajectory_q(policy: SyntheticPolicy, problem: ArithmeticProblem, steps: Sequence[Step]) -> list[float]:
    """The exact Q(0..n) of a trajectory's prefixes; Q(n) is its outcome.  Each label rule's
    truth is the rule applied to these (``labels.label_chunks``)."""
    names = [name for name, _ in problem.ops]
    n = len(names)
    q = [exact_q(policy, n, True, names)]
    for k, step in enumerate(steps, start=1):
        q.append(exact_q(policy, n - k, step.correct, names[k:]) if k < n else float(step.correct))
    return q


def true_q(
    policy: SyntheticPolicy, problem: ArithmeticProblem, done: int, value: int, samples: int = 20000, seed: int = 0
) -> float:
    """Monte Carlo estimate of the true Q of a prefix: an independent check of ``exact_q``."""
    rng = random.Random(seed)
    answer = problem.answer
    hits = sum(
        policy.continue_steps(problem, done, value, rng)[-1].value == answer
        if done < len(problem.ops)
        else value == answer
        for _ in range(samples)
    )
    return hits / samples
