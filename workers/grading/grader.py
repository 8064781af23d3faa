"""Grade final answers against a reference with math-verify, fast and bounded.

At fleet scale (thousands of rollouts a second) grading must cost almost nothing, so:
the reference is parsed once per problem (an LRU cache in the verify process), an answer whose ``\\boxed{}``
content equals the reference after light normalisation is accepted without sympy, and
every math-verify call runs under a timeout with a size cap, so one pathological answer
cannot stall a worker.  math-verify runs in a child process (``verify_process``), so the
limit holds in every pool (its SIGALRM timeout works only on a main thread) and a stuck
check is killed, not waited for.

Each grade says how it was decided (``method``), and rollouts store it, so answers that
timed out can be found and re-graded (``stepq regrade``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from stepq.models.errors import ConfigError
from stepq.workers.grading.verify_process import VerifyProcesses

_SPACES = re.compile(r"\s+")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_NUMBER = re.compile(r"^-?(?:\d+\.?\d*|\.\d+)$")
_WRAPPERS = re.compile(r"\\(?:left|right|displaystyle|!|,|;|:)")


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text):
        ch = text[j]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
        j += 1
    return None


def normalize(answer: str) -> str:
    """Cheap canonical form for the exact-match fast path (not a full equivalence)."""
    s = _WRAPPERS.sub("", answer)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("$", "")
    s = _THOUSANDS.sub("", s)
    s = _SPACES.sub("", s).rstrip(".")
    if s.startswith("\\text{") and s.endswith("}"):
        s = s[6:-1]
    return s


# Every rollout of a problem is graded against the same reference: normalise it once.
_normalized_reference = lru_cache(maxsize=65536)(normalize)


@dataclass(frozen=True)
class Grade:
    reward: int
    answer: str | None
    method: str  # exact | numeric | verify | no-answer | too-long | timeout | error


class Grader:
    """Grades completions; one per worker process, reused across tasks.

    The fast paths (exact and numeric) run in-process; everything that needs math-verify
    runs in a verify child process per thread, which is killed when it overruns.  So the
    limit holds in every pool, and the worker's own threads (its heartbeat) keep running
    while sympy works: a computation in C holds the GIL and would otherwise starve them.
    """

    def __init__(self, *, timeout_s: int = 3, max_answer_chars: int = 2000) -> None:
        self.timeout_s = timeout_s
        self.max_answer_chars = max_answer_chars
        self._children = VerifyProcesses()

    def close(self) -> None:
        """Stop the verify child processes (started on first use)."""
        self._children.close()

    def self_test(self) -> None:
        """Grade two answers only math-verify can (an equivalent fraction, a wrong one): a
        broken math-verify install would grade every such answer as a timeout or an error,
        i.e. wrong, and quietly turn right rollouts into negatives.  Raises ConfigError."""
        right = self.grade("so the answer is \\boxed{\\frac{1}{2}}", "0.5")
        wrong = self.grade("so the answer is \\boxed{\\frac{1}{3}}", "0.5")
        if (right.reward, right.method, wrong.reward, wrong.method) != (1, "verify", 0, "verify"):
            raise ConfigError(
                f"math-verify does not grade here (1/2 vs 0.5 graded {right.method}, 1/3 vs 0.5 graded "
                f"{wrong.method}): check its install (pip install 'math-verify[antlr4_13_2]')"
            )

    def grade(self, completion: str, reference: str) -> Grade:
        boxed = extract_boxed(completion)
        gold_text = _normalized_reference(reference)
        if boxed is not None:
            answer = normalize(boxed)
            if answer == gold_text:
                return Grade(1, boxed, "exact")
            if _NUMBER.match(answer) and _NUMBER.match(gold_text):
                # Two plain numbers: math-verify would compare them numerically too.
                return Grade(
                    int(abs(float(answer) - float(gold_text)) <= 1e-6 * max(1.0, abs(float(gold_text)))),
                    boxed,
                    "numeric",
                )
        if boxed is None and not completion.strip():
            return Grade(0, None, "no-answer")
        candidate = f"\\boxed{{{boxed}}}" if boxed is not None else completion[-self.max_answer_chars :]
        if len(candidate) > self.max_answer_chars:
            return Grade(0, boxed, "too-long")
        method, reward, parsed = self._children.get().check(reference, candidate, self.timeout_s)
        return Grade(reward, boxed if boxed is not None else parsed, method)
