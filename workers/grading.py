"""Grade final answers against a reference with math-verify, fast and bounded.

At fleet scale (thousands of rollouts a second) grading must cost almost nothing, so:
the reference is parsed once per problem (LRU cache), an answer whose ``\\boxed{}``
content equals the reference after light normalisation is accepted without sympy, and
every math-verify call runs under a timeout with a size cap, so one pathological answer
cannot stall a worker.  The timeout holds in every pool: on a main thread (solo and
prefork pools) math-verify's own SIGALRM limit bounds it in-process; on any other thread
(the threads pool) the check runs in a child process that is killed when it overruns.

Each grade says how it was decided (``method``), and rollouts store it, so answers that
timed out can be found and re-graded (``stepq regrade``).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from stepq.workers.verify_process import VerifyProcesses

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
    """Grades completions; one per worker process, reused across tasks."""

    def __init__(self, *, timeout_s: int = 3, max_answer_chars: int = 2000, cache_size: int = 50000) -> None:
        self.timeout_s = timeout_s
        self.max_answer_chars = max_answer_chars
        self.cache_size = cache_size
        self._gold: OrderedDict[str, tuple[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._children = VerifyProcesses()

    def _timeout(self) -> int | None:
        # math-verify's timeout uses SIGALRM, which only the main thread may set.
        return self.timeout_s if _on_main_thread() else None

    def close(self) -> None:
        """Stop the verify child processes that threads started (if any)."""
        self._children.close()

    def gold(self, reference: str) -> tuple[str, Any]:
        """(normalised text, parsed expression) of a reference, parsed once."""
        with self._lock:
            hit = self._gold.get(reference)
            if hit is not None:
                self._gold.move_to_end(reference)
                return hit
        from math_verify import parse

        parsed = parse(f"${reference}$", parsing_timeout=self._timeout()) or parse(
            reference, parsing_timeout=self._timeout()
        )
        value = (normalize(reference), parsed)
        with self._lock:
            self._gold[reference] = value
            if len(self._gold) > self.cache_size:
                self._gold.popitem(last=False)
        return value

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
        if not _on_main_thread():
            method, reward, parsed = self._children.get().check(reference, candidate, self.timeout_s)
            return Grade(reward, boxed if boxed is not None else parsed, method)
        return self._verify(self.gold(reference)[1], candidate, boxed)

    def _verify(self, gold: Any, candidate: str, boxed: str | None) -> Grade:
        from math_verify import parse, verify
        from math_verify.errors import TimeoutException

        timeout = self._timeout()
        try:
            pred = parse(candidate, parsing_timeout=timeout, raise_on_error=False)
            if not pred or not gold:
                return Grade(0, boxed, "no-answer")
            # raise_on_error: a timeout must say so (recorded, re-gradable), not read as "wrong".
            ok = verify(gold, pred, timeout_seconds=timeout, raise_on_error=True)
        except TimeoutException:
            return Grade(0, boxed, "timeout")
        except Exception:
            return Grade(0, boxed, "error")
        answer = boxed if boxed is not None else (str(pred[-1]) if pred else None)
        return Grade(int(bool(ok)), answer, "verify")


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
