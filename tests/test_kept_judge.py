"""Keeping one of several trainings by the labels' validation split: which one is kept, what it
is worth against a training drawn at random, and a run's files gathered by the judge's folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.experiments.kept_judge import at_work_figures, by_cell, collect, groups, paired, run_folder, summary


def training(val: float, f1: float, seed: int) -> dict:
    return {
        "validation_balanced_accuracy": val,
        "processbench_f1": f1,
        "thresholded_f1": f1 + 10,
        "training_seed": seed,
    }


def work(
    judge: str, judge_right: list[bool], plain_right: list[bool], oracle_gain: float, majority: list[bool]
) -> dict:
    n = len(judge_right)
    gain = 100.0 * (sum(judge_right) - sum(plain_right)) / n
    return {
        "judge": judge,
        "chunk_reset": {
            "judge": {"gain_over_plain": {"gain": gain, "ci": [gain - 5, gain + 5]}, "tokens_over_plain": 2.0},
            "oracle": {"gain_over_plain": {"gain": oracle_gain, "ci": [0, 0]}},
        },
        "best_of_n": [
            {"n": 1, "outcomes": {"majority": plain_right, "judge P(Positive)": plain_right}},
            {"n": 4, "outcomes": {"majority": majority, "judge P(Positive)": judge_right}},
        ],
    }


def test_the_validation_split_keeps_a_training_and_the_summary_weighs_it_against_a_random_draw() -> None:
    saved = {
        "runs": [
            {"seed": 0, "cell": "a/b", "label_trainings": [training(70.0, 40.0, 0), training(75.0, 60.0, 1000)]},
            {"seed": 1, "cell": "a/b", "label_trainings": [training(74.0, 50.0, 1), training(73.0, 80.0, 1001)]},
            {"seed": 2, "cell": "a/b", "label": training(70.0, 1.0, 2)},  # one training: nothing to keep
        ]
    }
    found = groups(saved)
    assert [(g["seed"], g["kept"]) for g in found] == [(0, 1), (1, 0)]
    f1 = summary(found)["processbench_f1"]
    assert f1["kept_mean"] == pytest.approx(55.0)  # (60 + 50) / 2
    assert f1["kept_min"] == 50.0
    assert f1["all_mean"] == pytest.approx(57.5)  # (50 + 65) / 2: a training drawn at random, group by group
    assert f1["all_min"] == 40.0
    assert f1["kept_is_best"] == 1  # seed 1's kept training is not its best on the held-out file
    assert "share" not in summary(found)  # no training was put to work


def test_at_work_the_share_is_of_the_oracles_gain_and_best_of_n_is_paired_against_majority() -> None:
    judge = [True, True, True, False]
    plain = [False, True, False, False]
    figures = at_work_figures(work("x", judge, plain, oracle_gain=100.0, majority=[False, True, True, False]))
    assert figures["gain"] == pytest.approx(50.0)
    assert figures["share"] == pytest.approx(0.5)
    assert list(figures["best_of_n_over_majority"]) == ["4"]  # N = 1 has nothing to choose
    assert figures["best_of_n_over_majority"]["4"]["gain"] == pytest.approx(25.0)  # one problem of four
    own = work("x", judge, plain, oracle_gain=100.0, majority=judge)  # judge_own_policy keeps the paired gain only
    own["best_of_n"] = [{"n": 4, "judge_over_majority": {"gain": -25.0, "ci": [-50.0, 0.0]}}]
    assert at_work_figures(own)["best_of_n_over_majority"] == {"4": {"gain": -25.0, "ci": [-50.0, 0.0]}}


def test_a_runs_files_are_gathered_by_the_judges_folder(tmp_path: Path) -> None:
    run = {"seed": 3, "cell": "spelled/first-dead/2/2000/8/abs-q/medium"}
    run["label_trainings"] = [training(66.0, 40.0, 3), training(75.0, 60.0, 1003)]
    run["label"] = run["label_trainings"][0]
    (tmp_path / "seed3.jsonl").write_text(json.dumps(run) + "\n")
    assert run_folder(run, 1) == "seed3-spelled_first-dead_2_2000_8_abs-q_medium-label-t1"
    # a run on another seed's backbone (--backbone-seed 0) finds its own trainings' logs, not these
    crossed = run_folder({**run, "backbone_seed": 0}, 1)
    assert crossed == "seed3-spelled_first-dead_2_2000_8_abs-q_medium-backbone0-label-t1"
    logs = []
    for k, right in enumerate(([True, False], [True, True])):
        log = tmp_path / f"work{k}.log"
        result = work(f"/runs/{run_folder(run, k)}", right, [False, False], oracle_gain=100.0, majority=[True, False])
        log.write_text("a table first\n" + json.dumps(result) + "\n")
        logs.append(log)
    saved = collect([tmp_path / "seed3.jsonl"], list(reversed(logs)))
    (found,) = groups(saved)
    assert found["kept"] == 1
    assert [r["at_work"]["share"] for r in found["trainings"]] == pytest.approx([0.5, 1.0])
    share = summary([found])["share"]
    assert (share["kept_mean"], share["all_mean"], share["all_min"]) == pytest.approx((1.0, 0.75, 0.5))


def test_a_saved_files_trainings_and_a_later_runs_are_joined_then_pooled_by_cell_and_paired_by_training(
    tmp_path: Path,
) -> None:
    """The rules' comparison: a saved file holds two trainings a seed and cell, a later run the
    third; each cell's trainings pooled over seeds, and each cell paired against the first by
    seed and training seed (a pair the first cell lacks is left out)."""

    def run(seed: int, cell: str, trainings: list[dict]) -> dict:
        out = {"seed": seed, "cell": cell, "train_rows": 10, "snapshot_rows": 10, "label": trainings[0]}
        return {**out, "label_trainings": trainings} if len(trainings) > 1 else out

    saved = {"runs": [run(0, "abs", [training(70.0, 40.0, 0), training(72.0, 50.0, 1000)]),
                      run(0, "rel", [training(71.0, 60.0, 0), training(73.0, 45.0, 1000)])]}  # fmt: skip
    (tmp_path / "saved.json").write_text(json.dumps(saved, indent=1))
    later = [run(0, "abs", [{**training(74.0, 60.0, 2000), "training": 2}]),
             run(0, "rel", [{**training(60.0, 90.0, 2000), "training": 2}]),
             run(1, "rel", [training(60.0, 99.0, 1), training(61.0, 98.0, 1001)])]  # fmt: skip
    (tmp_path / "t3.jsonl").write_text("".join(json.dumps(r) + "\n" for r in later))
    found = groups(collect([tmp_path / "saved.json", tmp_path / "t3.jsonl"], []))
    assert [(g["cell"], g["seed"], len(g["trainings"]), g["kept"]) for g in found] == [
        ("abs", 0, 3, 2),
        ("rel", 0, 3, 1),
        ("rel", 1, 2, 1),
    ]
    cells = by_cell(found)
    assert cells["abs"]["processbench_f1"]["mean"] == pytest.approx(50.0)  # (40 + 50 + 60) / 3
    assert cells["abs"]["processbench_f1"]["sd"] == pytest.approx(10.0)
    assert cells["rel"]["trainings"] == 5 and cells["rel"]["seeds"] == [0, 1]
    assert (cells["rel"]["processbench_f1"]["min"], cells["rel"]["processbench_f1"]["max"]) == (45.0, 99.0)
    # the third training read alone (--skip-trainings' line lists it): a group with nothing to choose
    alone = groups({"runs": [{**later[0], "label_trainings": [later[0]["label"]]}]})
    assert len(alone) == 1 and "processbench_f1" not in summary(alone)
    rel = paired(found)["rel"]
    assert rel["against"] == "abs" and rel["pairs"] == 3  # seed 1 has no abs to pair with
    assert rel["processbench_f1"] == {"above": 2, "min": -5.0, "max": 30.0}  # +20, -5, +30


def test_each_training_carries_its_last_training_loss_and_shows_it(capsys: pytest.CaptureFixture[str]) -> None:
    """The loss sorts trainings of one recipe (docs/experiments/judge_at_work.md): each row keeps
    its own, a run without one reads None, and the table prints it beside the validation figure."""
    from bench.experiments.kept_judge import show

    first, second = training(70.0, 40.0, 0), training(75.0, 60.0, 1000)
    first["loss"] = 0.0184
    (found,) = groups({"runs": [{"seed": 0, "cell": "a/b", "label_trainings": [first, second]}]})
    assert [r["loss"] for r in found["trainings"]] == [0.0184, None]
    show([found], {})
    out = capsys.readouterr().out
    assert "training loss 0.0184" in out and "training loss nan" in out
