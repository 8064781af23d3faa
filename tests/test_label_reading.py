"""What a cell's labels teach about right steps, counted on hand-written rows whose true Q is
worked out by hand."""

from __future__ import annotations

import pytest

from bench.experiments.label_reading import label_reading, steps_left, true_q_after

PROBLEM = "Start with 45. Subtract 7. Add 3. What is the result?"
RIGHT = "Step 1: 45 - 7 = 38.\n\n"
WRONG = "Step 1: 45 - 7 = 37.\n\n"  # its own arithmetic off by one
LAST = "Step 2: 38 + 3 = 41. So the answer is \\boxed{41}."
CARRIED = "Step 2: 37 + 3 = 40. So the answer is \\boxed{40}."  # right arithmetic on the wrong value
RATES = {"Add": 0.05, "Subtract": 0.25}


def row(chunk: str, label: str, history: tuple[str, ...] = (), truth: bool | None = None) -> dict:
    right = chunk in (RIGHT, LAST) and WRONG not in history
    return {"problem": PROBLEM, "problem_id": PROBLEM, "history": list(history), "chunk": chunk, "label": label,
            "chunk_index": len(history), "q_before": 0.5, "truth": right if truth is None else truth}  # fmt: skip


def test_steps_left_and_the_true_q_from_the_state_a_step_leaves() -> None:
    first, last = row(RIGHT, "Positive"), row(LAST, "Positive", (RIGHT,))
    assert steps_left(first) == 1 and steps_left(last) == 0
    # one step left, an Add (error rate 0.05): ends right with 0.95; none left: the answer's grade
    assert true_q_after(first, 0.15, 0.05, RATES) == pytest.approx(0.95)
    assert true_q_after(last, 0.15, 0.05, RATES) == 1.0
    assert true_q_after(row(CARRIED, "Negative", (WRONG,)), 0.15, 0.05, RATES) == 0.0
    # after a wrong step, one Add left: right only if it recovers (0.05)
    assert true_q_after(row(WRONG, "Negative"), 0.15, 0.05, RATES) == pytest.approx(0.05)
    # the Add's rate taken from the others' (0.15) when no rate is given for it
    assert true_q_after(first, 0.15, 0.05, {}) == pytest.approx(0.85)


def test_right_steps_are_read_apart_by_their_history_and_check_rows_only_in_their_figure() -> None:
    rows = [
        row(RIGHT, "Positive"),
        row(RIGHT, "Negative"),
        row(LAST, "Positive", (RIGHT,)),
        row(CARRIED, "Negative", (WRONG,)),
        row(WRONG, "Negative"),
        row(WRONG, "Negative"),
        row(WRONG, "Positive"),
    ]
    assert [r["truth"] for r in rows] == [True, True, True, False, False, False, False]
    q = [0.3, 0.95, 1.0, 0.0, 0.05, 0.05, 0.05]
    check = [{"local": True}, {"local": False}, {"local": True}, {"local": False}]
    found = label_reading(rows, q, check)
    assert found["wrong_steps"] == {"positive": 33.3, "n": 3}
    assert found["right_steps"] == {"positive": 50.0, "n": 4}
    assert found["right_steps_right_history"] == {"positive": 66.7, "n": 3}
    assert found["right_steps_wrong_history"] == {"positive": 0.0, "n": 1}
    # the one right step after an error: its true Q 0.0, alive before it, its wrong step 1 in the rows
    assert found["after_an_error"] == {
        "n": 1,
        "true_q_below_0.25": 100.0,
        "alive_before": 100.0,
        "earlier_wrong_step_in_rows": 100.0,
    }
    alone = label_reading(rows[3:4], q[3:4])["after_an_error"]
    assert alone["earlier_wrong_step_in_rows"] == 0.0, "its wrong step left out of the rows"
    assert found["right_by_steps_left"] == {0: {"positive": 50.0, "n": 2}, 1: {"positive": 50.0, "n": 2}}
    assert found["right_by_true_q"] == {
        "0.00-0.25": {"positive": 0.0, "n": 1},
        "0.25-0.50": {"positive": 100.0, "n": 1},
        "0.75-1.00": {"positive": 50.0, "n": 2},
    }
    # two right check rows, each Positive: (2 + 2) of (4 + 2)
    assert found["right_with_check_rows"] == {"positive": 66.7, "n": 6}
    assert label_reading(rows, q)["right_with_check_rows"] == found["right_steps"]
