"""Grading: the exact-match fast path, math-verify equivalence, and bounded bad answers."""

from __future__ import annotations

import threading

import pytest

from stepq.workers.grading import Grader, extract_boxed, normalize


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
def test_grade(completion: str, reference: str, reward: int, method: str) -> None:
    grade = Grader().grade(completion, reference)
    assert (grade.reward, grade.method) == (reward, method)


def test_reference_is_parsed_once() -> None:
    g = Grader()
    first = g.gold("\\frac{1}{2}")
    assert g.gold("\\frac{1}{2}") is first


def test_gold_cache_is_bounded() -> None:
    g = Grader(cache_size=3)
    for i in range(10):
        g.gold(str(i))
    assert len(g._gold) == 3


def test_grading_works_off_the_main_thread() -> None:
    results = []
    t = threading.Thread(target=lambda: results.append(Grader().grade("\\boxed{0.5}", "\\frac12")))
    t.start()
    t.join()
    assert results[0].reward == 1


def test_garbage_never_raises() -> None:
    g = Grader()
    for junk in ["\\boxed{\\frac{}{}}", "\\boxed{}", "\\boxed{\\sqrt[}", "\\boxed{x^^^^2}", "\x00\\boxed{1/0}"]:
        assert g.grade(junk, "1").reward in (0, 1)
