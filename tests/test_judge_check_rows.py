"""The check rows (``bench/experiments/judge_check_rows.py``): fresh steps whose claim is
changed on half of them, taught with what the check's own marks say."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from bench.experiments.judge_capacity import untaught_verdict, verdict_examples
from bench.experiments.judge_capacity_data import OWN_POLICY_SEED, own_policy_problems, taught_elsewhere
from bench.experiments.judge_check_rows import altered_chunk, check_rows
from bench.experiments.judge_format import EQUATION, spelled_analysis, step_local_truth
from bench.experiments.judge_trainings import joined_runs, judge_folder
from bench.experiments.kept_judge import run_folder
from stepq.models import Database
from stepq.models.problems import Problem
from stepq.workers.data.synthetic_set import synth_set


def test_an_altered_chunk_moves_its_claim_and_its_final_answer_together() -> None:
    assert altered_chunk("Step 1: 45 - 7 = 38.\n\n", 3) == "Step 1: 45 - 7 = 41.\n\n"
    last = "Step 2: 38 + 3 = 41.\nThe final answer is \\boxed{41}."
    assert altered_chunk(last, -2) == "Step 2: 38 + 3 = 39.\nThe final answer is \\boxed{39}."
    with pytest.raises(ValueError, match="not a step"):
        altered_chunk("no step here", 1)


def test_half_the_rows_claim_a_wrong_sum_and_their_truth_says_so() -> None:
    rows = check_rows(3, 40)
    assert len(rows) == 40 and sum(not r["local"] for r in rows) == 20
    for r in rows:
        a, op, b, claim = (EQUATION.search(r["chunk"]).group(k) for k in (1, 2, 3, 4))  # type: ignore[union-attr]
        right = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert (int(claim) == right) == r["local"] == step_local_truth(r)  # the program's truth agrees
        if not r["local"]:
            assert 1 <= abs(int(claim) - right) <= 9
        marks = spelled_analysis(r["chunk"]).split("\n")[1]
        assert ("#" in marks) != r["local"]  # the marks say what the verdict is taught
    taught = verdict_examples(rows, "local", "spelled")
    assert [a.endswith("{Positive}") for _, a in taught] == [r["local"] for r in rows]


def test_tens_too_moves_every_other_altered_claim_by_ten_and_leaves_the_rest_as_they_were() -> None:
    plain, tens = check_rows(3, 80), check_rows(3, 80, slips="tens-too")
    assert [(r["problem"], r["history"], r["local"]) for r in tens] == [
        (r["problem"], r["history"], r["local"]) for r in plain
    ]
    moved = 0
    for p, t in zip(plain, tens, strict=True):
        claim, right = int(EQUATION.search(t["chunk"]).group(4)), _right(t)  # type: ignore[union-attr]
        if abs(claim - right) == 10:
            moved += 1
            assert not t["local"] and claim % 10 == right % 10  # wrong in the tens digit alone
            assert ("#" in spelled_analysis(t["chunk"]).split("\n")[1]) and t["chunk"] != p["chunk"]
        else:
            assert t == p  # every other row is the 1-9 recipe's own
    assert moved == 20  # half of the 40 altered rows
    assert not any(abs(int(EQUATION.search(r["chunk"]).group(4)) - _right(r)) == 10 for r in plain)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="slips"):
        check_rows(3, 4, slips="tens")


def _right(row: dict[str, object]) -> int:
    a, op, b = (EQUATION.search(str(row["chunk"])).group(k) for k in (1, 2, 3))  # type: ignore[union-attr]
    return int(a) + int(b) if op == "+" else int(a) - int(b)


def test_the_rows_are_the_seeds_own_and_skip_the_problems_taught_or_scored_elsewhere() -> None:
    rows = check_rows(3, 10)
    assert rows == check_rows(3, 10) and rows != check_rows(4, 10)
    skipped = check_rows(3, 10, exclude={rows[0]["problem"], rows[4]["problem"]})
    assert rows[0]["problem"] not in {r["problem"] for r in skipped}
    assert rows[4]["problem"] not in {r["problem"] for r in skipped}


def test_a_judge_taught_check_rows_is_named_apart() -> None:
    plain = judge_folder(0, "spelled/first-dead/4/2000/8/abs-q/medium", "label", 1)
    checked = judge_folder(0, "spelled/first-dead/4/2000/8/abs-q/medium", "label", 1, check_rows=2000)
    assert checked == "seed0-spelled_first-dead_4_2000_8_abs-q_medium-check2000-label-t1" and checked != plain
    run = {"seed": 0, "cell": "spelled/first-dead/4/2000/8/abs-q/medium", "check_rows": 2000}
    assert run_folder(run, 1) == checked  # kept_judge finds its at-work log by that name
    t0 = {"training_seed": 0, "processbench_f1": 50.0, "thresholded_f1": 60.0, "step_accuracy": 70.0}
    t1 = {**t0, "training_seed": 1000}
    line = {"seed": 0, "cell": "c", "snapshot_rows": 10, "backbone_drill_accuracy": 97.0, "label_truth_agreement": 0.8}
    apart = joined_runs([{**line, "label": t0}, {**line, "check_rows": 2000, "label": t1}])
    assert sorted(r.get("check_rows", 0) for r in apart) == [0, 2000]  # two setups, not two trainings of one
    tens = judge_folder(
        0, "spelled/first-dead/4/2000/8/abs-q/medium", "label", 1, check_rows=2000, check_slips="tens-too"
    )
    assert tens == "seed0-spelled_first-dead_4_2000_8_abs-q_medium-check2000-tens-too-label-t1"
    assert run_folder({**run, "check_slips": "tens-too"}, 1) == tens
    slipped = joined_runs(
        [
            {**line, "check_rows": 2000, "label": t0},
            {**line, "check_rows": 2000, "check_slips": "tens-too", "label": t1},
        ]
    )
    assert sorted(r.get("check_slips", "1-9") for r in slipped) == ["1-9", "tens-too"]
    assert len(joined_runs([{**line, "label": t0}, {**line, "label": t1}])) == 1


def test_the_own_policy_held_out_problems_are_drawn_as_the_set_holds_them_and_kept_out(
    sqlite: Database, tmp_path: Path
) -> None:
    synth_set(sqlite, "own", problems=6, seed=OWN_POLICY_SEED + 2, numbers="small")
    with sqlite.session() as s:
        held = [p.question for p in s.scalars(select(Problem).order_by(Problem.external_id))]
    drawn = own_policy_problems(6, 2)
    assert sorted(drawn) == sorted(held) and drawn != own_policy_problems(6, 1)
    for name in ("heldout", "tune", "heldout-kinds", "tune-kinds"):
        (tmp_path / f"{name}.json").write_text("[]")
    excluded = taught_elsewhere(tmp_path, 2, [], "synthetic")
    assert set(own_policy_problems(1000, 2)) <= excluded  # chunk-reset's problems are never check rows
    assert not excluded & {r["problem"] for r in check_rows(2, 200, excluded)}
    # a neural policy's judge works on bench_judge_at_work's set: its rows stay as documented
    assert not set(own_policy_problems(1000, 2)) & taught_elsewhere(tmp_path, 2, [], "medium")


def test_untaught_check_verdicts_keep_the_analysis_taught_and_the_verdict_read() -> None:
    (_, answer), (_, wrong) = verdict_examples(check_rows(3, 2), "local", "spelled")
    record = untaught_verdict(wrong)
    assert record == {"completion": wrong[: -len("\\boxed{Negative}")], "untaught": "\\boxed{Negative}"}
    assert "#" in record["completion"]  # the marks are taught; what they mean is the labels' to teach
    assert untaught_verdict(answer)["untaught"] == "\\boxed{Positive}"
    cell = "spelled/first-dead/4/16000/8"
    read = judge_folder(0, cell, "label", check_rows=2000, check_verdicts="untaught")
    assert read == "seed0-spelled_first-dead_4_16000_8-check2000-untaught-label"
    assert read != judge_folder(0, cell, "label", check_rows=2000)
    run = {"seed": 0, "cell": cell, "check_rows": 2000, "check_verdicts": "untaught"}
    assert run_folder(run, 0) == read
    t0 = {"training_seed": 0, "processbench_f1": 50.0, "thresholded_f1": 60.0, "step_accuracy": 70.0}
    line = {"seed": 0, "cell": cell, "snapshot_rows": 10, "check_rows": 2000, "label": t0}
    apart = joined_runs([line, {**line, "check_verdicts": "untaught", "label": {**t0, "training_seed": 1000}}])
    assert len(apart) == 2  # two setups, not two trainings of one
