"""The judge benchmark's supervised capacity check and its GPU script (run here on CPU at tiny
size): the answer formats, which target a verdict is taught, and the whole chain end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.experiments.bench_judge_capacity import Cell
from bench.experiments.judge_capacity import answer_room, verdict_examples
from bench.experiments.judge_capacity_data import equal_rows, prepare, take_rows
from bench.experiments.judge_format import (
    chained_analysis,
    drill_lines,
    judge_answer,
    judge_prompt,
    recomputed_analysis,
    resolved_analysis,
    spelled_analysis,
    spelled_digits,
    step_local_truth,
    step_truth,
)
from bench.experiments.judge_trainings import joined_runs, selected_training, spread, training_seed

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = "Start with 45. Subtract 7. Add 3. What is the result?"
RIGHT = "Step 1: 45 - 7 = 38.\n\n"
WRONG = "Step 1: 45 - 7 = 37.\n\n"  # off by one: the first error


def test_recompute_redoes_the_steps_own_arithmetic() -> None:
    assert recomputed_analysis(WRONG) == "45 - 7 = 38"
    assert recomputed_analysis("Step 2: 37 + 3 = 40.") == "37 + 3 = 40"  # after an error: its own operands
    assert recomputed_analysis("no step here") == ""


def test_compact_redoes_it_in_a_spelling_the_prompt_never_shows_and_compare_adds_the_claim() -> None:
    import random

    row = {"problem": PROBLEM, "history": [], "chunk": WRONG}
    assert judge_answer(row, "Negative", "compact") == " Analysis:\n45-7=38\n\\boxed{Negative}"
    assert "45-7=" not in judge_prompt(PROBLEM, [], WRONG), "nothing in the prompt to copy the result from"
    assert judge_answer(row, "Negative", "compare") == " Analysis:\n45-7=38 vs 37\n\\boxed{Negative}"
    assert judge_answer({**row, "chunk": RIGHT}, "Positive", "compare").startswith(" Analysis:\n45-7=38 vs 38\n")
    drills = drill_lines(random.Random(0), 50).split("\n")
    assert len(drills) == 50 and len(set(drills)) > 40
    for line in drills:  # every drill right: ``a+b=c`` or ``a-b=c``, b one digit
        left, result = line.split("=")
        a, op, b = re.fullmatch(r"(-?\d+)([+-])(\d)", left).groups()  # type: ignore[union-attr]
        assert int(result) == (int(a) + int(b) if op == "+" else int(a) - int(b))


def test_resolve_re_solves_up_to_the_judged_step() -> None:
    assert resolved_analysis(PROBLEM, 2) == "Step 1: 45 - 7 = 38.\nStep 2: 38 + 3 = 41."


def test_truth_is_the_prefix_truth() -> None:
    assert step_truth({"problem": PROBLEM, "history": [], "chunk": RIGHT}) is True
    assert step_truth({"problem": PROBLEM, "history": [], "chunk": WRONG}) is False
    # locally right arithmetic after a wrong step is still wrong (the running value is)
    assert step_truth({"problem": PROBLEM, "history": [WRONG], "chunk": "Step 2: 37 + 3 = 40."}) is False


def test_the_local_truth_judges_the_step_alone() -> None:
    after_error = "Step 2: 37 + 3 = 40."  # right from the wrong value 37
    assert step_local_truth({"problem": PROBLEM, "history": [WRONG], "chunk": after_error}) is True
    # up to the first wrong step it is the truth
    for chunk in (RIGHT, WRONG):
        row = {"problem": PROBLEM, "history": [], "chunk": chunk}
        assert step_local_truth(row) is step_truth(row)
    # a step that recovers the true value from a wrong one computes wrong: locally wrong
    assert step_local_truth({"problem": PROBLEM, "history": [WRONG], "chunk": "Step 2: 37 + 3 = 41."}) is False
    # the wrong operation, the wrong operand, or a value other than the one written before
    for chunk in ("Step 1: 45 + 7 = 52.", "Step 1: 45 - 6 = 39.", "Step 1: 44 - 7 = 37."):
        assert step_local_truth({"problem": PROBLEM, "history": [], "chunk": chunk}) is False


def test_chain_recomputes_the_running_value_from_the_problem() -> None:
    # after a wrong step the chain carries the true value, so the claim 40 stands beside 41
    assert chained_analysis(PROBLEM, "Step 2: 37 + 3 = 40.") == "45-7=38\n38+3=41 vs 40\n4=4 1#0"
    assert chained_analysis(PROBLEM, RIGHT) == "45-7=38 vs 38\n3=3 8=8"
    assert chained_analysis(PROBLEM, "no step") == ""


def test_spelled_compares_digit_by_digit_right_aligned() -> None:
    assert spelled_digits("38", "37") == "3=3 8#7"
    assert spelled_digits("100", "99") == "1#_ 0#9 0#9"
    assert spelled_digits("-3", "3") == "-#_ 3=3"
    row = {"problem": PROBLEM, "history": [], "chunk": WRONG}
    assert judge_answer(row, "Negative", "spelled") == " Analysis:\n45-7=38 vs 37\n3=3 8#7\n\\boxed{Negative}"
    # a right step has no mark of difference; a wrong one has at least one
    for chunk, differs in ((RIGHT, False), (WRONG, True), ("Step 1: 45 - 7 = 48.", True)):
        assert ("#" in spelled_analysis(chunk)) is differs


def test_the_verdict_is_taught_from_the_target_asked_for() -> None:
    # a wrong step that rollouts still finished: labelled Positive, truly wrong
    row = {"problem": PROBLEM, "history": [], "chunk": WRONG, "label": "Positive", "truth": False}
    (_, by_label), (_, by_truth) = (verdict_examples([row], t, "recompute")[0] for t in ("label", "truth"))
    assert by_label == " Analysis:\n45 - 7 = 38\n\\boxed{Positive}"
    assert by_truth == " Analysis:\n45 - 7 = 38\n\\boxed{Negative}"
    # right from a wrong value: the truth says Negative, the step alone Positive
    after = {**row, "history": [WRONG], "chunk": "Step 2: 37 + 3 = 40.", "label": "Negative", "truth": False}
    assert verdict_examples([after], "truth", "none")[0][1] == " \\boxed{Negative}"
    assert verdict_examples([after], "local", "none")[0][1] == " \\boxed{Positive}"
    assert judge_answer(row, "Negative", "none") == " \\boxed{Negative}"
    prompt, _ = verdict_examples([row], "label", "none")[0]
    assert prompt.endswith(">> Step 1: 45 - 7 = 37.\nVerdict:")
    with pytest.raises(ValueError):
        verdict_examples([row], "labels", "none")


def test_the_judge_has_room_for_the_whole_answer() -> None:
    """A verdict cut short is no verdict: the first GPU run asked for 16 tokens and every
    17-character \\boxed{...} answer came back without one."""
    row = {"problem": PROBLEM, "history": [RIGHT], "chunk": "Step 2: 38 + 3 = 41."}
    for analysis in ("none", "recompute", "resolve"):
        longest = max(len(judge_answer(row, v, analysis)) for v in ("Positive", "Negative"))
        assert answer_room([row], analysis) > longest  # the end of text too


def test_cells_parse_and_refuse_garbage() -> None:
    assert Cell.parse("recompute/first-dead/4/600/16") == Cell("recompute", "first-dead", 4, 600, 16)
    ratio = Cell.parse("chain/first-dead/2/600/8/rel-ratio")
    assert ratio.rule == "rel-ratio" and ratio.name == "chain/first-dead/2/600/8/rel-ratio"
    assert ratio.data_key != Cell.parse("chain/first-dead/2/600/8").data_key  # its own snapshot
    assert ratio.annotation_key == Cell.parse("none/all/4/600/8").annotation_key  # of the same rollouts
    for bad in ("recompute/first-dead/4/600", "think/all/2/600/8", "none/some/2/600/8", "none/all/2/600/8/x-q"):
        with pytest.raises(SystemExit):
            Cell.parse(bad)


def test_repeated_trainings_differ_in_their_seed_alone_and_report_their_spread() -> None:
    """The first training is the single run's (its figures stay comparable with those before
    --trainings); the spread is over trainings, not over held-out problems."""
    assert [training_seed(3, k) for k in range(3)] == [3, 1003, 2003]
    trainings = [
        {"processbench_f1": 89.8, "thresholded_f1": 95.0, "step_accuracy": 90.0},
        {"processbench_f1": 69.8, "thresholded_f1": 93.0, "step_accuracy": 88.0},
        {"processbench_f1": 77.8, "thresholded_f1": 94.0, "step_accuracy": 92.0},
    ]
    f1 = spread(trainings)["processbench_f1"]
    assert f1["mean"] == pytest.approx(79.133, abs=1e-3)
    assert f1["sd"] == pytest.approx(10.066, abs=1e-3)  # sqrt(((10.667)^2 + (9.333)^2 + (1.333)^2) / 2)
    assert (f1["min"], f1["max"]) == (69.8, 89.8)
    assert spread(trainings)["step_accuracy"]["sd"] == pytest.approx(2.0)


def capacity_run(seed: int, trainings: list[dict], **data: object) -> dict:
    run = {"seed": seed, "cell": "a/b", "train_rows": 100, "snapshot_rows": 300, "backbone_drill_accuracy": 91.0}
    run.update(data)
    return {**run, "label": trainings[0], **({"label_trainings": trainings} if len(trainings) > 1 else {})}


def test_runs_that_taught_different_trainings_join_into_one_line_and_refuse_a_training_taught_twice() -> None:
    """--skip-trainings' run of the third training joins the run of the first two: the trainings
    in order of their seed, the spread and the kept one over all three; other data are refused."""
    first = [
        {"training_seed": 0, "processbench_f1": 60.0, "thresholded_f1": 80.0, "step_accuracy": 80.0,
         "validation_balanced_accuracy": 70.0},
        {"training_seed": 1000, "processbench_f1": 66.0, "thresholded_f1": 90.0, "step_accuracy": 85.0,
         "validation_balanced_accuracy": 72.0},
    ]  # fmt: skip
    third = {"training": 2, "training_seed": 2000, "processbench_f1": 90.0, "thresholded_f1": 96.0,
             "step_accuracy": 97.0, "validation_balanced_accuracy": 75.0}  # fmt: skip
    other_seed = capacity_run(1, [{**third, "training_seed": 2001}])
    (joined, alone) = joined_runs([capacity_run(0, [third]), other_seed, capacity_run(0, first)])
    assert [t["training_seed"] for t in joined["label_trainings"]] == [0, 1000, 2000]
    assert joined["label"]["training_seed"] == 0  # the first training stays the run's headline figure
    assert joined["label_spread"]["processbench_f1"]["mean"] == pytest.approx(72.0)
    assert joined["label_selected"] == 2  # the third, by its validation accuracy
    assert alone == other_seed and "label_spread" not in alone  # one training of seed 1: nothing joined
    with pytest.raises(ValueError, match="training seeds \\[1000\\]"):
        joined_runs([capacity_run(0, first), capacity_run(0, [first[1]])])
    with pytest.raises(ValueError, match="backbone_drill_accuracy"):
        joined_runs([capacity_run(0, first), capacity_run(0, [third], backbone_drill_accuracy=93.0)])
    # the same drills from another backbone (another processor's build): its hash tells them apart
    hashed = capacity_run(0, first, backbone_sha256="aa")
    with pytest.raises(ValueError, match="backbone_sha256"):
        joined_runs([hashed, capacity_run(0, [third], backbone_sha256="bb")])
    assert len(joined_runs([hashed, capacity_run(0, [third], backbone_sha256="aa")])[0]["label_trainings"]) == 3


def test_rows_taught_on_another_seeds_backbone_are_kept_apart_from_their_own() -> None:
    """--backbone-seed: the judge's folder names the other backbone (a crossed judge never lands
    in, nor is reused as, the folder of the rows' own), and runs of one seed's rows on two
    backbones stay two lines instead of being joined or refused as one setup."""
    from bench.experiments.judge_trainings import judge_folder

    own = judge_folder(2, "spelled/first-dead/2/2000/8/abs-q/medium", "label", 1)
    crossed = judge_folder(2, "spelled/first-dead/2/2000/8/abs-q/medium", "label", 1, backbone_seed=0)
    assert own == "seed2-spelled_first-dead_2_2000_8_abs-q_medium-label-t1"
    assert crossed == "seed2-spelled_first-dead_2_2000_8_abs-q_medium-backbone0-label-t1"
    assert judge_folder(2, "a/b", "label", backbone_seed=2) == judge_folder(2, "a/b", "label")  # its own: unnamed
    t = {"training_seed": 2, "processbench_f1": 50.0, "thresholded_f1": 60.0, "step_accuracy": 70.0}
    lines = joined_runs(
        [capacity_run(2, [t], backbone_seed=2, backbone_sha256="aa"),
         capacity_run(2, [t], backbone_seed=0, backbone_sha256="bb")]
    )  # fmt: skip
    assert sorted(line["backbone_seed"] for line in lines) == [0, 2]


def test_skipping_every_training_is_refused() -> None:
    from bench.experiments.bench_judge_capacity import parser, run

    for argv in (["--trainings", "2", "--skip-trainings", "2"], ["--skip-trainings", "-1"]):
        with pytest.raises(SystemExit, match="leaves none"):
            run(parser().parse_args(argv))


def test_the_kept_training_is_chosen_by_the_labels_validation_split_alone() -> None:
    """The held-out figures (the truth) must not pick the judge: the training with the best
    ProcessBench F1 here is not the one kept; a tie keeps the first; unmeasured, none."""
    trainings = [
        {"validation_balanced_accuracy": 67.4, "processbench_f1": 89.0},
        {"validation_balanced_accuracy": 76.4, "processbench_f1": 61.5},
        {"validation_balanced_accuracy": 76.4, "processbench_f1": 70.0},
    ]
    assert selected_training(trainings) == 1
    assert selected_training(trainings[:1]) == 0
    assert selected_training([{"processbench_f1": 50.0}, {"processbench_f1": 60.0}]) is None


@pytest.mark.slow
def test_the_gpu_script_runs_at_tiny_size_on_cpu(tmp_path: Path) -> None:
    """The script prepared for a GPU, on CPU: real annotation, a backbone built and pretrained,
    both targets taught, every figure reported; the data kept for a second run reused."""
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "bench.experiments.judge_gpu",
        "--device",
        "cpu",
        "--quick",
        "--data",
        str(tmp_path / "d"),
    ]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "judge_gpu" and result["device"] == "cpu"
    assert {r["cell"] for r in result["runs"]} == {"none/first-dead/1/40/4", "recompute/all/1/40/4"}
    for run in result["runs"]:
        assert run["train_rows"] > 0 and 0.5 < run["label_truth_agreement"] <= 1.0
        for target in ("label", "truth"):
            figures = run[target]
            assert figures["steps_judged"] > 0
            assert 0.0 <= figures["processbench_f1"] <= 100.0
            lo, hi = figures["thresholded_f1_ci"]
            assert lo <= figures["thresholded_f1"] <= hi
    first_dead = (tmp_path / "d" / "seed0" / "p40-m4-first-dead" / "train.json.gz").stat().st_mtime
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (tmp_path / "d" / "seed0" / "p40-m4-first-dead" / "train.json.gz").stat().st_mtime == first_dead


def test_the_gpu_script_says_when_there_is_no_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.experiments.judge_gpu", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "--device cpu" in done.stderr


@pytest.mark.slow
def test_a_kept_judge_is_scored_again_without_teaching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--rescore takes the judge an earlier run taught, with its loss, and refuses a folder
    whose run never finished (it is taught again instead); the judge at work finds the model in
    the kept folder."""
    from bench.experiments.bench_judge_at_work import load_judge
    from bench.experiments.judge_capacity import kept_verdict, pretrain_backbone, teach_verdict
    from stepq.trainer.evaluation.judges import StepItem

    backbone = tmp_path / "backbone"
    pretrain_backbone(backbone, 0, layers=1, width=64, problems=20, steps=3, numbers="small")
    rows = [
        {"problem": PROBLEM, "history": [], "chunk": RIGHT, "label": "Positive", "truth": True},
        {"problem": PROBLEM, "history": [], "chunk": WRONG, "label": "Negative", "truth": False},
    ]
    out = tmp_path / "judge"
    model, loss = teach_verdict(
        backbone, out, rows, target="label", analysis="none", steps=4, batch=2, lr=1e-3, seed=0
    )  # fmt: skip
    assert kept_verdict(out) == (model, loss) and (model / "config.json").exists()
    monkeypatch.chdir(tmp_path)  # --keep given as a relative path: the run recorded the absolute one
    assert kept_verdict(Path("judge"))[1] == loss
    # put to work (judge_own_policy --judge FOLDER): the taught model with the settings its run saved
    verdicts = load_judge(out, max_tokens=8).judge.judge([StepItem(PROBLEM, (), RIGHT)])
    assert len(verdicts) == 1 and verdicts[0] in (True, False, None)
    assert not (out / "stepq-judge.json").exists(), "the kept folder is not taken for the model"
    assert kept_verdict(tmp_path / "never-taught") is None
    (model / "config.json").unlink()  # a run cut before its final model
    assert kept_verdict(out) is None


def test_rows_are_drawn_under_the_seed_and_keep_their_order() -> None:
    rows = [{"i": i} for i in range(50)]
    drawn = take_rows(rows, 20, seed=3)
    assert len(drawn) == 20 and drawn == sorted(drawn, key=lambda r: r["i"])
    assert drawn == take_rows(rows, 20, seed=3) and drawn != take_rows(rows, 20, seed=4)
    assert take_rows(rows, None, seed=3) == rows and take_rows(rows, 80, seed=3) == rows


def test_rules_label_the_same_rollouts_and_are_taught_on_equal_rows(tmp_path: Path) -> None:
    """The rules' snapshots come from one annotated set: a chunk both keep has the same
    Q-values under each (only the label may differ), and --equal-rows teaches every cell on
    the smallest snapshot's size."""
    import argparse

    cells = [Cell.parse(f"none/first-dead/1/40/4{tail}") for tail in ("", "/rel-ratio")]
    args = argparse.Namespace(recovery_rate=0.05, heldout=10)
    prepare(tmp_path, [0], cells, args)

    def load(cell: Cell) -> list[dict]:
        import gzip

        with gzip.open(tmp_path / "seed0" / cell.data_key / "train.json.gz", "rt") as f:
            return json.load(f)

    abs_q, ratio = (load(c) for c in cells)
    q = {(r["problem"], r["chunk_index"]): (r["q_before"], r["q_after"]) for r in abs_q}
    shared = [r for r in ratio if (r["problem"], r["chunk_index"]) in q]
    assert shared, "the two snapshots share chunks"
    assert all(q[(r["problem"], r["chunk_index"])] == (r["q_before"], r["q_after"]) for r in shared)
    assert any(r["label"] == "Negative" and r["q_after"] > 0 for r in ratio), "Rel-Ratio's own labels"
    assert len(abs_q) != len(ratio) and equal_rows(tmp_path, 0, cells) == min(len(abs_q), len(ratio))


def test_a_cell_names_the_policy_whose_labels_it_teaches() -> None:
    cell = Cell.parse("spelled/first-dead/2/4000/8/abs-q/medium")
    assert (cell.rule, cell.policy) == ("abs-q", "medium")
    assert cell.name == "spelled/first-dead/2/4000/8/abs-q/medium"
    synthetic = Cell.parse("spelled/first-dead/2/4000/8")
    # a neural policy's set is another set: its data never shares a folder with the synthetic one's
    assert cell.annotation_key != synthetic.annotation_key and cell.data_key != synthetic.data_key
    with pytest.raises(SystemExit, match="policy one of"):
        Cell.parse("spelled/first-dead/2/4000/8/abs-q/strong")


@pytest.mark.slow
@pytest.mark.timeout(600)  # 25 s with the session's quick build kept; minutes more where its fixture builds it
def test_a_neural_policy_cell_is_taught_that_policys_own_samples(tmp_path: Path, quick_policies: Path) -> None:
    """The neural branch samples the trajectories from the policy and rolls out with it (the hf
    backend), not the synthetic policy: a 200-step build writes the format without the
    arithmetic, so the checker cannot read most of its steps, where it reads every step the
    synthetic policy writes; such a step is taught as wrong, never dropped or crashed on. The
    neural cell's rows are kept unbalanced: whether a 0/100 build answers any rollout right by
    chance depends on the processor, and with none balancing would leave no row to read."""
    from bench.experiments.bench_judge_capacity import parser
    from bench.experiments.judge_capacity_data import policy_dir, prepare_labels
    from stepq.workers.backends.synthetic_policy import step_is_right

    args = parser().parse_args(["--quick", "--policy-cache", str(quick_policies)])
    for text in ("none/all/1/12/2/abs-q/medium", "none/all/1/12/2"):
        cell = Cell.parse(text)
        neural = cell.policy == "medium"
        where = policy_dir(cell.policy, args, tmp_path)
        info = prepare_labels(tmp_path / "seed0", 0, [cell], 0.05, where, balanced=not neural)
        assert ("sample_s" in info) == neural
        rows = [r for name in ("train", "validation") for r in _rows(tmp_path / "seed0" / cell.data_key / name)]
        unreadable = [r for r in rows if step_is_right(r["problem"], r["history"], r["chunk"]) is None]
        if neural:
            assert len(unreadable) > len(rows) / 2
            assert all(r["truth"] is False and r["local"] is False for r in unreadable)
        else:
            assert rows and not unreadable and all("local" not in r for r in rows)


def _rows(stem: Path) -> list[dict]:
    import gzip

    with gzip.open(stem.with_name(stem.name + ".json.gz"), "rt") as f:
        return json.load(f)


def test_a_later_runs_trainings_are_numbered_by_their_index_not_their_place(capsys: pytest.CaptureFixture) -> None:
    """--skip-trainings 1 --trainings 3 teaches trainings #2 and #3: the printout and the kept
    one name them so, not #1 and #2."""
    from bench.experiments.bench_judge_capacity import show

    def taught(k: int, val: float) -> dict:
        figures = {name: 50.0 for name in ("processbench_f1", "thresholded_f1", "step_accuracy")}
        cis = {f"{name}_ci": [40.0, 60.0] for name in figures}
        return {**figures, **cis, "training": k, "training_seed": 1000 * k, "validation_balanced_accuracy": val,
                "no_verdict": 0, "train_s": 1, "eval_s": 1}  # fmt: skip

    trainings = [taught(1, 70.0), taught(2, 75.0)]
    run = capacity_run(0, trainings, positive_share=0.5, label_truth_agreement=0.9, random_guess_f1=16.0)
    run["label_selected"] = selected_training(trainings)
    show(run)
    out = capsys.readouterr().out
    assert "taught label#2" in out and "taught label#3" in out and "label#1" not in out
    assert "kept by the labels' validation split: #3" in out
