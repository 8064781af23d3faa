"""GRPO training of a tiny judge on a snapshot in PostgreSQL, recorded; the evaluator scores
a ProcessBench file with its checkpoint; the trainer service trains when labels appear and
resumes after a SIGKILL.  The model is built here (random weights, nothing downloaded)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepq.assembly import worker_runtime
from stepq.models import Database, queries
from stepq.trainer.evaluation.judge_spec import JudgeSpec, build_judge
from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
from stepq.trainer.tiny_model import build_tiny_model
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.runs import TrainOptions
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions
from tests.helpers import DATA, annotated_set, clean_env, run_stepq, wait_for
from tests.trainer_helpers import tiny_recipe, train_snapshot

SAMPLE = DATA / "processbench_gsm8k_sample.json"
pytestmark = pytest.mark.integration


def _env(pg_url: str, **extra: str) -> dict[str, str]:
    return clean_env(STEPQ_DATABASE_URL=pg_url, PYTHONUNBUFFERED="1", **extra)


def _stepq(pg_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_stepq(*args, env=_env(pg_url), timeout=600)


def test_grpo_run_is_recorded_and_its_checkpoint_scores_processbench(pg: Database, pg_url: str, tmp_path: Path) -> None:
    annotated_set(pg, problems=30, error_rate=0.25, recovery_rate=0.0)
    snapshot = create_snapshot(pg, SnapshotSpec(("s",), "abs-q", val_fraction=0.2, seed=0))
    model = build_tiny_model(tmp_path / "model", n_positions=4096)
    template = tmp_path / "judge.txt"
    template.write_text("P: {problem}\nH: {history}\nC: {chunk}\nVerdict in \\boxed{{}}:")
    recipe_file = tiny_recipe(tmp_path / "tiny.yaml", model, max_steps=4, save_steps=2)
    recipe_file.write_text(recipe_file.read_text() + f"judge_template: {template}\n")
    recipe = Recipe.load(recipe_file)
    result = train_snapshot(pg, snapshot, recipe, tmp_path / "run")
    assert result.status == "done" and result.global_step == 4 and result.resumed_from is None
    with pg.session() as s:
        run = queries.get_run(s, result.run_id)
        metrics = queries.run_metrics(s, run.id)
        progress = queries.training_progress(s)
        assert run.status == "done" and run.snapshot_id == snapshot and run.lease_owner is None
        assert run.recipe == recipe.text and run.base_model == str(model)
        assert [Path(c).name for c in run.checkpoints] == ["checkpoint-2", "checkpoint-4"]
        assert [m.step for m in metrics] == [1, 2, 3, 4]
        for m in metrics:
            assert m.reward is not None and 0.0 <= m.reward <= 2.0
            assert m.completion_length is not None and m.completion_length > 0
            assert m.entropy is not None and m.clip_ratio is not None
            assert m.accuracy_positive is not None or m.accuracy_negative is not None
            assert "rewards/verdict_match/mean" in m.values
        assert progress[0]["run"] == run.id and progress[0]["step"] == 4
    checkpoint = Path(run.last_checkpoint or "")
    assert (checkpoint / "model.safetensors").exists() and (result.final_model / "config.json").exists()
    # started again, a finished run is reported, not retrained
    assert train_snapshot(pg, snapshot, recipe, tmp_path / "run").run_id == result.run_id

    # killed after its last checkpoint but before it was marked done: the rerun trains no
    # step past the plan and makes that checkpoint the final model
    import shutil

    from sqlalchemy import update

    from stepq.models.training import TrainingRun

    with pg.session() as s:
        s.execute(update(TrainingRun).where(TrainingRun.id == run.id).values(status="running", finished_at=None))
    shutil.rmtree(result.final_model)
    again = train_snapshot(pg, snapshot, recipe, tmp_path / "run")
    assert (again.run_id, again.global_step, again.resumed_from) == (run.id, 4, str(checkpoint))
    assert (again.final_model / "model.safetensors").exists() and not (again.final_model / "optimizer.pt").exists()
    with pg.session() as s:
        assert queries.get_run(s, run.id).status == "done" and queries.get_run(s, run.id).resumes == 1

    # evaluation asks the judge as it was trained: its template, raw prompt, its length limit
    template.unlink()  # read at training time: the judge does not depend on the file staying
    for model_dir in (result.final_model, checkpoint):
        built = build_judge(JudgeSpec(model=str(model_dir)))
        assert built.settings is not None and built.settings.source == f"training run {run.id}"
        assert built.settings.trained_on == ({"set": "s", "backend": "synthetic", "numbers": "default"},)
        assert built.judge.prompt.template.startswith("P: {problem}")
        assert built.judge.chat_template is False and built.judge.params.max_tokens == 12
        overridden = build_judge(JudgeSpec(model=str(model_dir), chat_template=True, max_tokens=5))
        assert overridden.judge.chat_template is True and overridden.judge.params.max_tokens == 5

    out = tmp_path / "eval"
    done = _stepq(
        pg_url,
        "eval",
        "processbench",
        "--data",
        str(SAMPLE),
        "--judge",
        "model",
        "--backend",
        "hf",
        "--model",
        str(checkpoint),
        "--max-tokens",
        "8",
        "--out",
        str(out),
        "--json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    (subset,) = report["subsets"]
    samples = json.loads(SAMPLE.read_text())
    assert subset["subset"] == SAMPLE.stem and subset["samples"] == len(samples)
    assert report["judge_settings"]["source"] == f"training run {run.id}"
    assert report["judge_settings"]["max_tokens"] == 8  # --max-tokens given
    # what the judge wrote is counted: 8 tokens leave no room for a verdict
    assert subset["judge_outputs"] >= len(samples)
    assert subset["no_verdict"] == subset["truncated"] == subset["judge_outputs"]
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert {p["id"] for p in predictions} == {s["id"] for s in samples}
    # an untrained judge gives no verdicts: every sample stops at its first step (prediction 0)
    assert all(p["prediction"] == 0 for p in predictions)
    # and the written predictions re-score to the same figures without a judge
    rescored = _stepq(
        pg_url, "eval", "processbench", "--data", str(SAMPLE), "--predictions", str(out / "predictions.jsonl"), "--json"
    )
    assert rescored.returncode == 0, rescored.stderr
    metric = ("subset", "samples", "erroneous", "correct", "acc_error", "acc_correct", "f1")
    assert [{k: r[k] for k in metric} for r in json.loads(rescored.stdout)["subsets"]] == [
        {k: r[k] for k in metric} for r in report["subsets"]
    ]


def test_a_second_trainer_waits_for_the_run_lease(pg: Database, tmp_path: Path) -> None:
    from stepq.models.base import epoch
    from stepq.models.errors import TrainingBusy

    annotated_set(pg, problems=20, error_rate=0.25, recovery_rate=0.0)
    snapshot = create_snapshot(pg, SnapshotSpec(("s",), "abs-q", val_fraction=0.2))
    model = build_tiny_model(tmp_path / "model")
    recipe = Recipe.load(tiny_recipe(tmp_path / "tiny.yaml", model))
    with pg.session() as s:
        run_id = queries.create_run(
            s,
            snapshot_id=snapshot,
            method="grpo",
            recipe="x",
            base_model=str(model),
            output_dir=str((tmp_path / "run").resolve()),
            host="other",
        )
        assert queries.claim_run(s, run_id, "other-host:1:abc", 60, "other")
        assert queries.get_run(s, run_id).lease_expires_at > epoch()
    with pytest.raises(TrainingBusy, match="other-host"):
        train_snapshot(pg, snapshot, recipe, tmp_path / "run", TrainOptions(wait_s=0.5))


def test_trainer_service_trains_when_labels_appear_and_resumes_after_sigkill(
    pg: Database, pg_url: str, tmp_path: Path
) -> None:
    synth_set(pg, "s", problems=30, seed=1, error_rate=0.25, recovery_rate=0.0)
    model = build_tiny_model(tmp_path / "model")
    recipe = tiny_recipe(tmp_path / "tiny.yaml", model, max_steps=40, save_steps=4)
    env = _env(pg_url, STEPQ_TRAINER_LEASE_TTL_S="3")
    cmd = [
        sys.executable,
        "-m",
        "stepq",
        "trainer",
        "serve",
        "--lineage",
        "judge",
        "--sets",
        "s",
        "--min-new-chunks",
        "20",
        "--recipe",
        str(recipe),
        "--output-root",
        str(tmp_path / "runs"),
        "--poll",
        "0.3",
        "--max-trainings",
        "1",
        "--val-fraction",
        "0.2",
    ]
    log1 = (tmp_path / "serve1.log").open("wb")
    first = subprocess.Popen(cmd, env=env, stdout=log1, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        time.sleep(3)
        assert first.poll() is None, (tmp_path / "serve1.log").read_text()
        with pg.session() as s:
            assert queries.snapshot_summaries(s) == [], "no labels yet: nothing to snapshot"
        configure_annotation(pg, "s", 8)
        run_in_process(pg, worker_runtime(pg, WorkerOptions(batch_rollouts=64, name="annotator")))

        def checkpointed() -> bool:
            with pg.session() as s:
                runs = queries.lineage_runs(s, "judge")
                return bool(runs) and runs[0].last_checkpoint is not None and runs[0].status == "running"

        wait_for(checkpointed, 240, "a checkpoint of the first training", interval=0.1)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    with pg.session() as s:
        (killed,) = queries.lineage_runs(s, "judge")
        assert killed.status == "running" and killed.global_step < 40, "killed mid-training"
        step_at_kill = killed.global_step
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming training run" in second.stderr
    with pg.session() as s:
        (run,) = queries.lineage_runs(s, "judge")  # the same run row, no second run
        snapshots = queries.snapshot_summaries(s)
        steps = [m.step for m in queries.run_metrics(s, run.id)]
    assert run.id == killed.id and run.status == "done" and run.global_step == 40
    assert run.resumes == 1 and len(snapshots) == 1 and snapshots[0]["lineage"] == "judge"
    assert step_at_kill >= 4 and steps[-1] == 40 and len(steps) == len(set(steps))
