"""What a spelled judge reads: its written check against the program's, and its verdict against
its own marks, counted on hand-written answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.experiments.judge_format import analysis_text, judge_answer
from bench.experiments.judge_reading import (
    chain_departure,
    chain_ends_right,
    check_parts,
    checked_truth,
    claims_its_own_value,
    copies_steps_term,
    heldout_steps,
    marks_verdict,
    program_check_f1,
    reading,
    sum_is_claim,
    written_check,
)

PROBLEM = "Start with 45. Subtract 7. Add 3. What is the result?"
RIGHT = "Step 1: 45 - 7 = 38.\n\n"
WRONG = "Step 1: 45 - 7 = 37.\n\n"  # its own arithmetic off by one
COPIED = "Step 1: 45 - 9 = 36.\n\n"  # right arithmetic on an operand the problem does not hold


def row(chunk: str, **more: object) -> dict:
    return {"problem": PROBLEM, "history": [], "chunk": chunk, **more}


def test_the_check_and_its_marks_are_read_from_the_answer() -> None:
    answer = judge_answer(row(WRONG), "Negative", "spelled")
    assert written_check(answer) == "45-7=38 vs 37\n3=3 8#7"
    assert marks_verdict(written_check(answer)) is False
    assert marks_verdict(written_check(judge_answer(row(RIGHT), "Positive", "spelled"))) is True
    assert written_check(" \\boxed{Positive}") is None and marks_verdict(None) is None
    assert marks_verdict("45-7=38 vs 37") is None  # no digit line: nothing to follow


def test_a_wrong_check_and_a_verdict_against_its_marks_are_counted_apart() -> None:
    rows = [row(RIGHT), row(WRONG), row(WRONG), row("Step 1: forty five.\n\n")]
    answers = [
        judge_answer(rows[0], "Positive", "spelled"),  # right check, follows its marks, right
        judge_answer(rows[1], "Positive", "spelled"),  # right check, a # and Positive: wrong
        " Analysis:\n45-7=37 vs 37\n3=3 7=7\n\\boxed{Positive}",  # wrong check, follows it, wrong
        " \\boxed{Negative}",  # a step the checker cannot read: not counted
    ]
    verdicts = [True, True, True, False]
    r = reading(rows, answers, verdicts)
    assert r["steps"] == 3
    assert r["check_right"] == {"n": 3, "percent": pytest.approx(200 / 3)}
    assert r["verdict_follows_marks"] == {"n": 3, "percent": pytest.approx(200 / 3)}
    assert r["verdict_right_where_check_right"] == {"n": 2, "percent": 50.0}
    assert r["verdict_right_where_check_wrong"] == {"n": 1, "percent": 0.0}
    assert "verdict_agrees_with_label" not in r
    # the wrong check wrote the step's claim as its own sum: its sum is wrong, its copies right
    assert {k: v["percent"] for k, v in r["check_parts_right"].items()} == pytest.approx(
        {"operands": 100.0, "sum": 200 / 3, "claim": 100.0, "marks": 100.0}
    )
    # its sum is right on the right step, wrong on one of the two wrong ones, and that wrong sum
    # is the step's claim: the shortcut, not a slip
    assert r["sum_right_by_step"] == {
        "right steps": {"n": 1, "percent": 100.0},
        "wrong steps": {"n": 2, "percent": 50.0},
    }
    assert r["wrong_sum_is_claim"] == {"n": 1, "percent": 100.0}


def test_each_part_of_a_written_check_is_read_against_the_programs() -> None:
    expected = "45-7=38 vs 37\n3=3 8#7"
    assert check_parts(expected, expected) == {"operands": True, "sum": True, "claim": True, "marks": True}
    assert check_parts("45-9=36 vs 37\n3=3 6#7", expected) == {
        "operands": False, "sum": True, "claim": True, "marks": True
    }  # fmt: skip
    assert check_parts("45-7=38 vs 38\n3=3 8=8", expected)["claim"] is False
    # a wrong sum that is the step's claim, one that is a slip of its own, and no check at all
    assert sum_is_claim("45-7=37 vs 37\n3=3 7=7", expected) is True
    assert sum_is_claim("45-7=39 vs 37\n3=3 9#7", expected) is False
    assert sum_is_claim(None, expected) is None
    assert check_parts("45-7=38 vs 37\n3=3 8=7", expected)["marks"] is False  # a mark against its own digits
    assert check_parts("45-7=38", expected) is None and check_parts(None, expected) is None


def test_against_the_labels_a_clean_check_can_still_be_a_negative_step() -> None:
    """A copied operand: the arithmetic is right, the marks clean, the label Negative; a judge
    that follows its marks disagrees with that label, and the count says where."""
    rows = [row(COPIED, label="Negative", local=False), row(WRONG, label="Negative", local=False)]
    answers = [judge_answer(r, "Positive" if k == 0 else "Negative", "spelled") for k, r in enumerate(rows)]
    r = reading(rows, answers, [True, False])
    assert r["verdict_follows_marks"]["percent"] == 100.0
    assert r["verdict_agrees_with_label"] == {
        "clean marks": {"n": 1, "percent": 0.0},
        "a # mark": {"n": 1, "percent": 100.0},
    }


def test_a_chain_check_sees_an_earlier_error_a_one_step_check_cannot() -> None:
    """Right arithmetic on a value an earlier step got wrong, read as each analysis: the spelled
    check redoes 37 + 3 and writes clean marks (the step alone is right, and that is the truth
    it is scored by); the chain recomputes 45 - 7 + 3 from the problem and marks the claim 40
    against 41 (the step leaves the solution wrong, its truth).  A verdict following its marks is
    right by each one's truth, and only the chain's agrees with the Negative label."""
    after = {"problem": PROBLEM, "history": [WRONG], "chunk": "Step 2: 37 + 3 = 40.\n\n", "label": "Negative"}
    assert analysis_text(after, "spelled") == "37+3=40 vs 40\n4=4 0=0"
    assert analysis_text(after, "chain") == "45-7=38\n38+3=41 vs 40\n4=4 1#0"
    assert checked_truth(after, "spelled") is True and checked_truth(after, "chain") is False
    for analysis, verdict in (("spelled", True), ("chain", False)):
        answer = judge_answer(after, "Positive" if verdict else "Negative", analysis)
        r = reading([after], [answer], [verdict], analysis)
        assert r["check_right"]["percent"] == 100.0 and r["verdict_follows_marks"]["percent"] == 100.0
        assert r["verdict_right_where_check_right"] == {"n": 1, "percent": 100.0}
        assert r["verdict_agrees_with_label"] == (
            {"clean marks": {"n": 1, "percent": 0.0}} if verdict else {"a # mark": {"n": 1, "percent": 100.0}}
        )
    # a chain's truth is the row's stored one where its preparation kept it
    assert checked_truth({**after, "truth": True}, "chain") is True
    assert reading([after], [""], [None], "chain")["check_parts_right"]["sum"]["n"] == 0  # a chain's parts unread
    with pytest.raises(ValueError, match="marks"):
        reading([after], [""], [None], "compact")


def test_the_heldout_steps_stop_at_each_solutions_first_wrong_step() -> None:
    samples = [
        {"id": "x", "problem": PROBLEM, "steps": ["a", "b", "c"], "label": 1},
        {"id": "y", "problem": PROBLEM, "steps": ["d", "e"], "label": -1},
    ]
    assert [s["chunk"] for s in heldout_steps(samples)] == ["a", "b", "d", "e"]
    assert heldout_steps(samples)[1]["history"] == ["a"]


@pytest.mark.slow
def test_a_kept_judge_is_read_through_its_greedy_answers(tmp_path: Path) -> None:
    """The glue: the folder ``--keep`` kept is asked as ``evaluate_capacity`` asks it, and every
    readable step is counted once (a tiny judge: what it writes is not the point)."""
    from bench.experiments.judge_capacity import pretrain_backbone, teach_verdict
    from bench.experiments.judge_reading import read_judge

    backbone = tmp_path / "backbone"
    pretrain_backbone(backbone, 0, layers=1, width=64, problems=20, steps=3, numbers="small", drills=5)
    rows = [row(RIGHT, label="Positive", truth=True), row(WRONG, label="Negative", truth=False)]
    teach_verdict(
        backbone, tmp_path / "judge", rows, target="label", analysis="spelled", steps=4, batch=2, lr=1e-3, seed=0
    )
    r = read_judge(tmp_path / "judge", [*rows, row("Step 1: forty five.\n\n")], max_new=40)
    assert r["steps"] == 2
    assert r["verdict_right_where_check_right"]["n"] + r["verdict_right_where_check_wrong"]["n"] == 2


def test_a_wrong_chain_is_read_by_where_it_first_departs() -> None:
    """Hand-written chains for step 2 of 45 - 7 + 3 (claim 40): a slip in the first line that the
    judge carries on with, a slip on the judged step's own line, a wrong digit line, one line
    missing, and no analysis; each counted where it departs, with its verdict scored by the
    chain's truth (the step is wrong: 41, not 40)."""
    after = {"problem": PROBLEM, "history": [RIGHT], "chunk": "Step 2: 38 + 3 = 40.\n\n"}
    expected = "45-7=38\n38+3=41 vs 40\n4=4 1#0"
    assert analysis_text(after, "chain") == expected and checked_truth(after, "chain") is False
    early_carried = "45-7=37\n37+3=40 vs 40\n4=4 0=0"  # the earlier slip carried: clean marks
    early_mended = "45-7=37\n38+3=41 vs 40\n4=4 1#0"  # an earlier slip, the last two lines right
    own_line = "45-7=38\n38+3=40 vs 40\n4=4 0=0"
    digits = "45-7=38\n38+3=41 vs 40\n4=4 1=0"
    short = "38+3=41 vs 40\n4=4 1#0"
    assert chain_departure(expected, expected) is None
    assert [chain_departure(w, expected) for w in (early_carried, own_line, digits, short, None)] == [
        "an earlier step's line", "the judged step's line", "the digit line", "an earlier step's line", "no check"
    ]  # fmt: skip
    assert chain_departure(expected + "\n4=4", expected) == "the length"
    assert chain_ends_right(early_mended, expected) and chain_ends_right(short, expected)
    assert not chain_ends_right(early_carried, expected) and not chain_ends_right(None, expected)
    answers = [f" Analysis:\n{w}\n\\boxed{{{v}}}" for w, v in (
        (early_carried, "Positive"), (early_mended, "Negative"), (own_line, "Positive"), (digits, "Negative"),
        (expected, "Negative"),
    )] + [" \\boxed{Positive}"]  # fmt: skip
    verdicts = [True, False, True, False, False, True]
    r = reading([after] * 6, answers, verdicts, "chain")
    assert r["check_right"] == {"n": 6, "percent": pytest.approx(100 / 6)}
    assert r["wrong_chain_departs_at"] == {
        "no check": {"n": 1, "percent": 0.0},
        "an earlier step's line": {"n": 2, "percent": 50.0},  # the mended one's Negative is right
        "the judged step's line": {"n": 1, "percent": 0.0},
        "the digit line": {"n": 1, "percent": 100.0},
    }
    assert r["wrong_chain_ends_right"] == {"n": 5, "percent": 20.0}  # the mended one only
    assert "wrong_chain_departs_at" not in reading([after], [answers[0]], [True], "spelled")


def test_the_programs_own_check_followed_perfectly_is_the_ceiling_on_a_file() -> None:
    """Three solutions: right throughout, wrong arithmetic at step 1, and a copied operand at step
    0 (right arithmetic on a number the problem does not hold).  The chain flags each first
    wrong step; the one-step check misses the copied operand (it calls that solution right)."""
    samples = [
        {"id": "right", "problem": PROBLEM, "steps": [RIGHT, "Step 2: 38 + 3 = 41.\n\n"], "label": -1},
        {"id": "slip", "problem": PROBLEM, "steps": [RIGHT, "Step 2: 38 + 3 = 40.\n\n"], "label": 1},
        {"id": "copied", "problem": PROBLEM, "steps": [COPIED, "Step 2: 36 + 3 = 39.\n\n"], "label": 0},
    ]
    assert program_check_f1(samples, "chain") == pytest.approx(100.0)
    # spelled: right 1/1 and erroneous 1/2 (the copied one predicted right): F1 = 2 * 1 * 0.5 / 1.5
    assert program_check_f1(samples, "spelled") == pytest.approx(200 / 3)


def test_a_chain_that_computes_the_steps_own_term_is_counted() -> None:
    """A copied operand at step 2 (the problem adds 3, the step adds 5): the program's chain
    marks the claim; a judge that computes the step's own term from the right running value
    writes clean marks; one that slips elsewhere is not counted as that."""
    copied = {"problem": PROBLEM, "history": [RIGHT], "chunk": "Step 2: 38 + 5 = 43.\n\n"}
    expected = analysis_text(copied, "chain")
    assert expected == "45-7=38\n38+3=41 vs 43\n4=4 1#3"
    took_steps = "45-7=38\n38+5=43 vs 43\n4=4 3=3"
    assert copies_steps_term(took_steps, expected, copied["chunk"])
    assert not copies_steps_term("45-7=38\n38+3=42 vs 43\n4=4 2#3", expected, copied["chunk"])  # a slip
    assert not copies_steps_term("45-7=37\n37+5=42 vs 43\n4=4 2#3", expected, copied["chunk"])  # the value off
    assert not copies_steps_term(None, expected, copied["chunk"])
    assert not copies_steps_term("38+5=43 vs 43", expected, copied["chunk"])  # one line: no digit line under it
    # a step whose own term is the problem's is never counted, whatever the judge wrote
    assert not copies_steps_term(
        "45-7=38\n38+3=40 vs 40\n4=4 0=0", "45-7=38\n38+3=41 vs 40\n4=4 1#0", "Step 2: 38 + 3 = 40.\n\n"
    )
    r = reading([copied], [f" Analysis:\n{took_steps}\n\\boxed{{Positive}}"], [True], "chain")
    assert r["wrong_chain_computes_steps_term"] == {"n": 1, "percent": 100.0}
    assert r["verdict_right_where_check_wrong"] == {"n": 1, "percent": 0.0}


def test_a_chain_that_puts_its_own_value_where_the_claim_goes_is_counted() -> None:
    """A slip in the tens digit at step 2 (38 + 3 claimed as 31): the program's chain marks the
    claim's tens digit; a judge that writes its own value beside ``vs`` leaves clean marks and
    accepts the step; a judge that reads the claim right but slips elsewhere is not counted."""
    slipped = {"problem": PROBLEM, "history": [RIGHT], "chunk": "Step 2: 38 + 3 = 31.\n\n"}
    expected = analysis_text(slipped, "chain")
    assert expected == "45-7=38\n38+3=41 vs 31\n4#3 1=1"
    own = "45-7=38\n38+3=41 vs 41\n4=4 1=1"
    assert claims_its_own_value(own, expected)
    assert not claims_its_own_value(expected, expected)  # the claim read right
    assert not claims_its_own_value("45-7=38\n38+3=42 vs 31\n4#3 2#1", expected)  # a slip in its own value
    assert not claims_its_own_value(None, expected) and not claims_its_own_value("38+3=41 vs 41", expected)
    # a step whose claim is its value: writing that value beside vs is reading it right
    right = analysis_text({**slipped, "chunk": "Step 2: 38 + 3 = 41.\n\n"}, "chain")
    assert not claims_its_own_value("45-7=38\n38+3=41 vs 41\n4=4 1=1", right)
    answers = [f" Analysis:\n{w}\n\\boxed{{{v}}}" for w, v in ((own, "Positive"), (expected, "Negative"))]
    r = reading([slipped] * 2, answers, [True, False], "chain")
    assert r["wrong_chain_claims_its_own_value"] == {"n": 1, "percent": 100.0}
    assert r["wrong_chain_computes_steps_term"] == {"n": 1, "percent": 0.0}
    assert r["verdict_right_where_check_wrong"] == {"n": 1, "percent": 0.0}
