"""bench_judge_grpo's whole chain at tiny size, and a second GRPO setting from the kept seed."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["--quick", "--seeds", "0", "--analysis", "spelled", "--form", "first-dead", "--prm-steps", "0"]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "bench.experiments.bench_judge_grpo", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def _annotation(db: Path) -> tuple[int, ...]:
    with sqlite3.connect(db) as conn:
        return tuple(
            conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("problem_sets", "trajectories", "rollouts", "snapshots")
        )


@pytest.mark.slow
@pytest.mark.timeout(900)  # five benchmark runs (~110 s alone): past 300 s beside other work
def test_a_second_grpo_setting_reuses_the_kept_data_and_base(tmp_path: Path) -> None:
    first = _bench(*QUICK, "--keep", str(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    run = json.loads(first.stdout.strip().splitlines()[-1])["runs"][0]
    seed_dir = tmp_path / "seed0-abs-q"
    assert run["grpo_steps"] == 6 and (seed_dir / "grpo-lr0.0002-beta0-g4x16-steps6" / "final").is_dir()
    annotated = _annotation(seed_dir / "stepq.db")
    # a judge brought back from another machine is scored by the very code the benchmark scores with
    from bench.experiments.judge_grpo_gpu import evaluate_elsewhere

    scored = evaluate_elsewhere(seed_dir, seed_dir / "grpo-lr0.0002-beta0-g4x16-steps6" / "final", 0)
    assert json.loads(json.dumps(scored)) == run["trained"]
    base_weights = sorted((seed_dir / "base").glob("*.safetensors"))[0].read_bytes()

    again = _bench(*QUICK, "--keep", str(tmp_path), "--reuse", "--beta", "0.1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "reusing the data and base judge" in again.stdout
    rerun = json.loads(again.stdout.strip().splitlines()[-1])["runs"][0]
    # the same base, data and held-out file: its figures are the first run's, not re-measured on another
    assert rerun["base"] == run["base"] and rerun["prepare_s"] == run["prepare_s"]
    assert rerun["train_chunks"] == run["train_chunks"] and rerun["random_guess_f1"] == run["random_guess_f1"]
    assert _annotation(seed_dir / "stepq.db") == annotated  # nothing annotated or snapshotted again
    assert sorted((seed_dir / "base").glob("*.safetensors"))[0].read_bytes() == base_weights  # GRPO left it
    assert (seed_dir / "grpo-lr0.0002-beta0.1-g4x16-steps6" / "final").is_dir()

    other = _bench(*QUICK, "--keep", str(tmp_path), "--reuse", "--rollouts", "4")
    assert other.returncode != 0 and "these settings differ" in other.stderr
    # the synthetic policy's labels are never taken for a neural policy's
    neural = _bench(*QUICK, "--keep", str(tmp_path), "--reuse", "--policy", "medium")
    assert neural.returncode != 0 and "these settings differ" in neural.stderr
    wide = _bench(*QUICK, "--policy", "medium", "--numbers", "default")
    assert wide.returncode != 0 and "--numbers small" in wide.stderr
    assert _bench(*QUICK, "--reuse").returncode != 0  # nothing kept to reuse
    without_reuse = _bench(*QUICK, "--keep", str(tmp_path))  # never prepared over a kept seed
    assert without_reuse.returncode != 0 and "--reuse starts from it" in without_reuse.stderr


def test_the_grpo_recipe_trains_where_asked_with_the_benchmark_settings() -> None:
    from bench.experiments.bench_judge_grpo import grpo_recipe, parser

    kept = Path("/kept/seed3-abs-q")  # only named in the recipe: nothing is read or written
    flags = ["--generations", "4", "--prompts-per-step", "64", "--steps", "900", "--beta", "0.1"]
    on_cpu = grpo_recipe(parser().parse_args(flags), kept, 60, 3)
    on_gpu = grpo_recipe(parser().parse_args([*flags, "--device", "cuda"]), kept, 60, 3)
    assert on_cpu.trainer["use_cpu"] is True and on_gpu.trainer["use_cpu"] is False
    for recipe in (on_cpu, on_gpu):  # the same objective either way: only the device differs
        assert recipe.model == str(kept / "base")
        assert recipe.trainer["per_device_train_batch_size"] == 256 and recipe.trainer["num_generations"] == 4
        assert (recipe.trainer["max_steps"], recipe.trainer["beta"], recipe.trainer["seed"]) == (900, 0.1, 3)
        assert recipe.trainer["max_completion_length"] == 60 and recipe.trainer["loss_type"] == "grpo"
        assert recipe.trainer["bf16"] is False  # float32 on both: TRL alone would autocast to bf16
    assert {k: v for k, v in on_cpu.trainer.items() if k != "use_cpu"} == {
        k: v for k, v in on_gpu.trainer.items() if k != "use_cpu"
    }
