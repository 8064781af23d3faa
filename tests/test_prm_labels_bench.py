"""bench_prm_labels: the summary over trainings on hand-made runs, and repeated trainings at tiny
size that reuse a seed's preparation and take its finished trainings as they are."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.experiments.bench_prm_labels import paired_difference, saved_runs, summary, truth_examples

ROOT = Path(__file__).resolve().parents[1]


def _training(steps_auc: float, outcomes_auc: float, ci: tuple[float, float]) -> dict[str, Any]:
    return {
        "steps": {"step_auc": steps_auc, "within_position_auc": 0.5},
        "outcomes": {"step_auc": outcomes_auc, "within_position_auc": 0.6},
        "step_auc_difference": {"value": steps_auc - outcomes_auc, "ci": list(ci)},
    }


def test_the_summary_counts_every_training_of_every_seed_and_its_spread() -> None:
    runs = [
        {"trainings": [_training(0.70, 0.60, (0.05, 0.15)), _training(0.60, 0.62, (-0.08, 0.04))]},
        {"trainings": [_training(0.80, 0.50, (0.20, 0.40))]},
    ]
    out = summary(runs)
    assert out["trainings"] == 3
    assert out["steps_step_auc"]["mean"] == pytest.approx(0.70)
    assert out["steps_step_auc"]["sd"] == pytest.approx(0.10)  # sample sd of 0.7, 0.6, 0.8
    assert out["steps_step_auc"]["range"] == [0.60, 0.80]
    assert out["outcomes_step_auc"]["mean"] == pytest.approx((0.60 + 0.62 + 0.50) / 3)
    assert (out["steps_above"], out["steps_above_clear_of_zero"], out["outcomes_above_clear_of_zero"]) == (2, 2, 0)
    # a run saved before --trainings is one training
    legacy = _training(0.5, 0.7, (-0.3, -0.1))
    assert summary([legacy])["outcomes_above_clear_of_zero"] == 1
    # a run saved before the paired difference: its AUCs count, no difference is made up
    unpaired = {k: v for k, v in _training(0.9, 0.5, (0.3, 0.5)).items() if k != "step_auc_difference"}
    out = summary([legacy, unpaired])
    assert out["steps_step_auc"]["mean"] == pytest.approx(0.70)
    assert (out["paired_trainings"], out["steps_above"], out["outcomes_above_clear_of_zero"]) == (1, 0, 1)


def test_saved_runs_are_read_from_a_json_file_or_a_logs_last_line(tmp_path: Path) -> None:
    runs = [{"seed": 3, **_training(0.7, 0.6, (0.01, 0.2))}]
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"benchmark": "bench_prm_labels", "runs": runs}, indent=1))
    log = tmp_path / "seed3.log"
    log.write_text("  seed 3: snapshot 1 holds 9 training steps\n" + json.dumps({"runs": runs}) + "\n")
    assert saved_runs(saved) == saved_runs(log) == runs


def test_the_paired_difference_is_the_difference_of_the_step_aucs_on_the_same_problems() -> None:
    # two problems, (position, score, right): the first PRM ranks perfectly, the second inverts
    good = [[(0, 0.9, True), (1, 0.1, False)], [(0, 0.8, True), (1, 0.2, False)]]
    inverted = [[(k, 1 - p, r) for k, p, r in problem] for problem in good]
    diff = paired_difference(good, inverted, 0)
    assert diff["value"] == 1.0 and diff["ci"][0] == 1.0
    assert paired_difference(inverted, good, 0)["value"] == -1.0, "the order of the two matters"


def _bench(keep: Path, *extra: str) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.experiments.bench_prm_labels", "--quick", "--keep", str(keep), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_more_trainings_reuse_the_preparation_and_train_only_the_new_ones(tmp_path: Path) -> None:
    keep = tmp_path / "kept"
    first = _bench(keep)["runs"][0]
    again = _bench(keep, "--reuse", "--trainings", "2")["runs"][0]
    assert [t["training_seed"] for t in again["trainings"]] == [0, 1000]
    # training 0 is the kept run, scored again: the same figures, nothing trained
    for arm in ("steps", "outcomes"):
        assert again["trainings"][0][arm]["step_auc"] == first[arm]["step_auc"]
        assert again[arm]["step_auc"] == first[arm]["step_auc"], "training 0's figures stay at the top level"
    with sqlite3.connect(keep / "seed0" / "stepq.db") as db:
        runs = db.execute("SELECT output_dir, status FROM training_runs ORDER BY id").fetchall()
    folders = [Path(out).name for out, _ in runs]
    assert folders == ["prm-steps", "prm-outcomes", "prm-steps-t1", "prm-outcomes-t1"], folders
    assert {status for _, status in runs} == {"done"}
    # the second training is another training of the same data: its own seed moves the weights
    assert again["trainings"][1]["steps"]["step_auc"] != first["steps"]["step_auc"]
    assert again["trainings"][1]["outcome_solutions"] == first["outcome_solutions"]


@pytest.mark.slow
def test_the_ceiling_trains_the_same_steps_on_the_synthetic_truth(tmp_path: Path) -> None:
    from stepq.models import Database
    from stepq.models.snapshots import TRAIN
    from stepq.trainer.methods.prm import snapshot_steps
    from stepq.trainer.snapshots.export import snapshot_records

    keep = tmp_path / "kept"
    run = _bench(keep, "--ceiling")["runs"][0]
    assert "truth" in run and "truth" in run["trainings"][0]
    db = Database(f"sqlite:///{keep / 'seed0' / 'stepq.db'}")
    truth, labels = truth_examples(db, 1), snapshot_steps(db, 1)
    train = snapshot_records(db, 1)[TRAIN]
    with sqlite3.connect(keep / "seed0" / "stepq.db") as conn:
        right = dict(conn.execute("SELECT id, ground_truth FROM chunks").fetchall())
    by_trajectory: dict[int, dict[int, float]] = {}
    for r in train:
        by_trajectory.setdefault(r["trajectory_id"], {})[r["chunk_index"]] = float(right[r["chunk_id"]])
    expected = [tuple(chunks[i] for i in sorted(chunks)) for _, chunks in sorted(by_trajectory.items())]
    assert [e.targets for e in truth] == expected, "each target is its chunk's ground truth"
    assert [(e.problem, e.steps) for e in truth] == [(e.problem, e.steps) for e in labels], "the same steps"
    differ = 0
    for t, m in zip(truth, labels, strict=True):
        for a, b in zip(t.targets, m.targets, strict=True):
            assert (a is None) == (b is None)
            differ += a is not None and a != b
    assert differ > 0, "with recovery, Abs-Q calls some wrong steps Positive: the truth must differ there"
