"""Grading: the exact-match fast path, math-verify equivalence, and bounded bad answers."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import pytest

from stepq.workers.grading.grader import Grader, extract_boxed, normalize
from stepq.workers.grading.verify_process import GoldCache


@pytest.fixture(scope="module")
def grader() -> Iterator[Grader]:
    g = Grader()
    yield g
    g.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\fbox{7}", "7"),
        ("no box", None),
        ("\\boxed{unclosed", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_normalize() -> None:
    assert normalize("\\left( 3, \\frac{\\pi}{2} \\right)") == normalize("(3,\\frac{\\pi}{2})")
    assert normalize("1,000") == "1000"
    assert normalize("\\dfrac{1}{2}.") == "\\frac{1}{2}"
    assert normalize("\\text{(C)}") == "(C)"


@pytest.mark.parametrize(
    ("completion", "reference", "reward", "method"),
    [
        ("\\boxed{97}", "97", 1, "exact"),
        ("\\boxed{96}", "97", 0, "numeric"),
        ("\\boxed{0.50}", "0.5", 1, "numeric"),
        ("\\boxed{-3}", "3", 0, "numeric"),
        ("\\boxed{x = 97}", "97", 1, "verify"),
        ("The answer is \\boxed{\\frac{1}{2}}", "0.5", 1, "verify"),
        ("\\boxed{\\dfrac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1, "verify"),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1, "exact"),
        ("", "1", 0, "no-answer"),
        ("I give up", "1", 0, "no-answer"),
        ("\\boxed{" + "1+" * 3000 + "1}", "1", 0, "too-long"),
    ],
)
def test_grade(grader: Grader, completion: str, reference: str, reward: int, method: str) -> None:
    grade = grader.grade(completion, reference)
    assert (grade.reward, grade.method) == (reward, method)


def test_reference_is_parsed_once() -> None:
    cache = GoldCache(size=3)
    first = cache.get("\\frac{1}{2}", 3)
    assert cache.get("\\frac{1}{2}", 3) is first and cache.parses == 1


def test_gold_cache_is_bounded() -> None:
    cache = GoldCache(size=3)
    for i in [*range(10), 9]:
        cache.get(str(i), 3)
    assert len(cache._items) == 3 and cache.parses == 10


PATHOLOGICAL = "\\boxed{9^{9^{9^{9}}}}"  # sympy would compute it for ever


@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_pathological_answer_times_out_on_any_thread(where: str) -> None:
    grader = Grader(timeout_s=1)
    results: list[tuple[float, str, int]] = []

    def grade_twice() -> None:
        for completion in (PATHOLOGICAL, "\\boxed{0.5}"):
            started = time.monotonic()
            g = grader.grade(completion, "\\frac12" if "0.5" in completion else "1")
            results.append((time.monotonic() - started, g.method, g.reward))

    try:
        if where == "main":
            grade_twice()
        else:
            t = threading.Thread(target=grade_twice)
            t.start()
            t.join(timeout=60)
            assert not t.is_alive(), "grading on a thread had no limit"
    finally:
        grader.close()
    (slow, method, reward), (_, after_method, after_reward) = results
    assert (method, reward) == ("timeout", 0) and slow < 1 + 2 + 1, "bounded by the timeout (plus the kill backstop)"
    assert (after_method, after_reward) == ("verify", 1), "the next answer is graded normally"


def test_the_heartbeat_thread_runs_while_a_pathological_answer_is_graded() -> None:
    """sympy's big-integer work holds the GIL: in-process it would starve other threads."""
    grader = Grader(timeout_s=2)
    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.05):
            ticks.append(time.monotonic())

    t = threading.Thread(target=tick)
    t.start()
    try:
        grader.grade("\\boxed{1}", "\\frac{2}{2}")  # start the child first
        ticks.clear()
        assert grader.grade(PATHOLOGICAL, "1").method == "timeout"
    finally:
        stop.set()
        t.join()
        grader.close()
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert len(ticks) >= 10 and max(gaps) < 0.5, f"longest pause of the other thread: {max(gaps):.2f}s"


def test_garbage_is_graded_wrong_with_a_reason(grader: Grader) -> None:
    for junk in ["\\boxed{\\frac{}{}}", "\\boxed{}", "\\boxed{\\sqrt[}", "\\boxed{x^^^^2}", "\x00\\boxed{1/0}"]:
        grade = grader.grade(junk, "1")
        assert grade.reward == 0 and grade.method in {"no-answer", "error", "verify"}, (junk, grade)
