"""``stepq train`` under a real 2-process launch (``torchrun --nproc_per_node 2``, gloo on
CPU): DDP is really on (each rank is rewarded on its own share of the prompts), one run row
records it, and a SIGKILL of the whole launch followed by the same command resumes that row
from its last checkpoint to the planned step count."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepq.models import Database, queries
from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
from stepq.trainer.tiny_model import build_tiny_model
from tests.helpers import annotated_set, clean_env, wait_for
from tests.trainer_helpers import tiny_recipe

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 24


def _launch(pg_url: str, recipe: Path, out: Path, trace: Path, snapshot: int) -> subprocess.Popen[str]:
    env = clean_env(
        STEPQ_DATABASE_URL=pg_url,
        STEPQ_TRAINER_LEASE_TTL_S="4",
        STEPQ_TRACE_DIR=str(trace),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
    )
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533"),
        *("-m", "stepq", "train", "--snapshot", str(snapshot), "--recipe", str(recipe)),
        *("--output", str(out), "--wait", "30"),
    ]
    # its own session: the kill below takes the launcher and both ranks, as a node loss would
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def test_two_ranks_train_one_run_and_resume_it_after_sigkill(pg: Database, pg_url: str, tmp_path: Path) -> None:
    annotated_set(pg, problems=30, error_rate=0.25, recovery_rate=0.0)
    snapshot = create_snapshot(pg, SnapshotSpec(("s",), "abs-q", val_fraction=0.2, seed=0))
    model = build_tiny_model(tmp_path / "model", n_positions=4096)
    recipe = tiny_recipe(tmp_path / "tiny.yaml", model, max_steps=STEPS, save_steps=4, completion_length=96)
    out, trace = tmp_path / "run", tmp_path / "trace"
    trace.mkdir()

    first = _launch(pg_url, recipe, out, trace, snapshot)

    def checkpointed() -> bool:
        assert first.poll() is None, first.communicate()[0][-3000:]
        with pg.session() as s:
            runs = [queries.run_by_output(s, str(out.resolve()))]
            return runs[0] is not None and runs[0].last_checkpoint is not None

    wait_for(checkpointed, timeout=240, what="the first checkpoint of the 2-rank run")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    with pg.session() as s:
        killed = queries.run_by_output(s, str(out.resolve()))
        assert killed is not None and killed.status == "running" and killed.resumes == 0
        assert killed.global_step < STEPS
    # the ranks died with their launcher: nothing trains on, orphaned, beside the rerun
    checkpoints = sorted(p.name for p in out.glob("checkpoint-*"))
    time.sleep(4)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == checkpoints
    with pg.session() as s:
        still = queries.get_run(s, killed.id)
        assert (still.global_step, still.status) == (killed.global_step, "running")

    time.sleep(1)  # the dead launch's rendezvous port is free again
    second = _launch(pg_url, recipe, out, trace, snapshot)
    output, _ = second.communicate(timeout=420)
    assert second.returncode == 0, output[-4000:]
    # only rank 0 reports the run
    assert output.count(f"at step {STEPS}") == 1, output[-2000:]

    with pg.session() as s:
        runs = [r for r in queries.training_progress(s)]
        assert len(runs) == 1, runs
        run = queries.get_run(s, runs[0]["run"])
        assert (run.id, run.status, run.global_step, run.resumes) == (killed.id, "done", STEPS, 1)
        assert run.lease_owner is None
        assert [m.step for m in queries.run_metrics(s, run.id)] == list(range(1, STEPS + 1))
        assert [Path(c).name for c in run.checkpoints][-1] == f"checkpoint-{STEPS}"
    assert (out / "final" / "config.json").exists()

    # DDP was on: both ranks were rewarded, each reward call on its own prompts
    calls = {r: [json.loads(line) for line in (trace / f"rank-{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    assert calls[0] and len(calls[0]) == len(calls[1])
    for mine, theirs in zip(calls[0], calls[1], strict=True):
        assert mine and theirs and not set(mine) & set(theirs), (mine, theirs)


def test_the_trainer_service_launches_each_training_on_two_ranks(pg: Database, pg_url: str, tmp_path: Path) -> None:
    annotated_set(pg, problems=20, error_rate=0.25, recovery_rate=0.0)
    model = build_tiny_model(tmp_path / "model")
    recipe = tiny_recipe(tmp_path / "tiny.yaml", model, max_steps=3, save_steps=3)
    trace = tmp_path / "trace"
    trace.mkdir()
    env = clean_env(STEPQ_DATABASE_URL=pg_url, STEPQ_TRACE_DIR=str(trace), OMP_NUM_THREADS="1")
    serve = [
        *(sys.executable, "-m", "stepq", "trainer", "serve", "--lineage", "ddp", "--sets", "s"),
        *("--min-new-chunks", "10", "--recipe", str(recipe), "--output-root", str(tmp_path / "runs")),
        *("--max-trainings", "1", "--val-fraction", "0.2", "--processes", "2"),
    ]
    done = subprocess.run(serve, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "launching 2 training processes" in done.stderr
    with pg.session() as s:
        (run,) = queries.lineage_runs(s, "ddp")
        assert (run.status, run.global_step, run.lineage) == ("done", 3, "ddp")
        assert run.base_model == str(model)
    assert (trace / "rank-0.jsonl").read_text() and (trace / "rank-1.jsonl").read_text()
