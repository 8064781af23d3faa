"""What operators watch: Prometheus metrics, JSON log lines, the live status view."""

from __future__ import annotations

import io
import json
import logging
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from stepq.assembly import worker_runtime
from stepq.log_setup import JsonFormatter
from stepq.metrics import StepqCollector
from stepq.models import Database, jobs, queries
from stepq.models.errors import GenerationError
from stepq.models.work import ROLLOUT_WORK
from stepq.status import watch
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.backends import Completion, GenerationRequest, SamplingParams
from stepq.workers.backends.synthetic import SyntheticBackend
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.dispatcher import Dispatcher
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.labelling.rollout_handler import run_work_items
from tests.helpers import clean_env, outlets


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_report_what_the_tables_hold(pg: Database) -> None:
    synth_set(pg, "m", problems=6, seed=3)
    configure_annotation(pg, "m", 4)
    rt = worker_runtime(pg, WorkerOptions(name="metered")).start()
    try:
        run_in_process(pg, rt)
        rt.heartbeat.beat()
        with pg.session() as s:
            queries.count_event(s, "lease_expiries", 2)
        registry = CollectorRegistry()
        registry.register(StepqCollector(pg, lambda: 7))
        got = _samples(registry)
    finally:
        rt.close()
    with pg.engine.connect() as conn:
        from sqlalchemy import text

        stored = conn.execute(text("SELECT count(*) FROM rollouts")).scalar_one()
        tokens = conn.execute(text("SELECT sum(tokens) FROM rollouts")).scalar_one()
        prompt = conn.execute(text("SELECT sum(prompt_tokens) FROM rollouts")).scalar_one()
    assert got[("stepq_rollouts_total", (("set", "m"),))] == stored > 0
    assert got[("stepq_tokens_total", (("set", "m"),))] == tokens > 0
    assert got[("stepq_prompt_tokens_total", (("set", "m"),))] == prompt > tokens
    assert got[("stepq_work_items", (("set", "m"), ("state", "done")))] == 6
    assert got[("stepq_work_items", (("set", "m"), ("state", "pending")))] == 0
    assert got[("stepq_events_total", (("event", "lease_expiries"),))] == 2
    assert got[("stepq_broker_queue_depth", ())] == 7
    mine = {
        name: v
        for (name, labels), v in got.items()
        if ("worker", rt.name) in labels and name != "stepq_worker_graded_total"
    }
    assert mine["stepq_worker_rollouts_total"] == stored
    assert mine["stepq_worker_tokens_total"] == tokens
    assert mine["stepq_worker_engine_seconds_total"] > 0
    graded = sum(v for (name, labels), v in got.items() if name == "stepq_worker_graded_total")
    assert graded == stored, "every rollout's grading outcome is counted once"
    assert got[("stepq_workers", (("state", "live"),))] == 1
    assert got[("stepq_broker_queue_bound", ())] == 2, "two messages for the one live worker"


def test_metrics_show_silent_workers_and_training_runs(sqlite: Database) -> None:
    """What the dashboard's worker and training panels read: a worker that stopped
    heartbeating without stopping is silent (one that stopped is neither), and each run's
    last logged step, reward and loss."""
    import time

    from stepq.models.work import Worker
    from stepq.trainer.training.records import metric_row

    now = time.time()
    with sqlite.session() as s:
        for name, beat, stopped in (("frozen", now - 300, None), ("gone", now - 300, now - 200), ("up", now, None)):
            s.add(Worker(name=name, hostname="h", pid=1, backend="synthetic", last_heartbeat=beat, stopped_at=stopped))
        run = queries.create_run(
            s, method="grpo", recipe="", base_model="m", output_dir="/r", host="h", lineage="j", global_step=20
        )
    with sqlite.session() as s:
        queries.upsert_metrics(
            s,
            [
                metric_row(run, 10, {"loss": 0.5, "reward": 0.25}, {}),
                metric_row(run, 20, {"loss": 0.4, "reward": 0.75}, {}),
            ],
        )
    registry = CollectorRegistry()
    registry.register(StepqCollector(sqlite))
    got = _samples(registry)
    assert (got[("stepq_workers", (("state", "live"),))], got[("stepq_workers", (("state", "silent"),))]) == (1, 1)
    key = (("lineage", "j"), ("method", "grpo"), ("run", str(run)))
    assert got[("stepq_training_reward", key)] == 0.75 and got[("stepq_training_loss", key)] == 0.4
    assert got[("stepq_training_step", (*key, ("status", "running")))] == 20


def test_metrics_command_serves_prometheus_text(pg_url: str, pg: Database, tmp_path: Path) -> None:
    synth_set(pg, "served", problems=2, seed=1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = clean_env(STEPQ_DATABASE_URL=pg_url, STEPQ_BROKER_URL="redis://127.0.0.1:1/0")
    proc = subprocess.Popen([sys.executable, "-m", "stepq", "metrics", "--port", str(port)], env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "metrics server did not start"
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert 'stepq_work_items{set="served",state="pending"} 0.0' in body
    assert "stepq_broker_queue_depth" in body


class _FailsAll(SyntheticBackend):
    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
        raise GenerationError("HTTP 400: bad request", permanent=True)


def test_json_log_lines_name_the_worker_set_and_item(sqlite: Database) -> None:
    synth_set(sqlite, "logged", problems=1, seed=1)
    configure_annotation(sqlite, "logged", 2)
    with sqlite.session() as s:
        (work_id,) = jobs.pending_ids(s, ROLLOUT_WORK, 5)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("stepq")
    logger.addHandler(handler)
    try:
        rt = worker_runtime(sqlite, WorkerOptions(name="json"), backend=_FailsAll())
        run_work_items(rt, [work_id])
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    failure = next(line for line in lines if "failed (permanent)" in line["message"])
    assert (failure["worker"], failure["set"], failure["item"]) == (rt.name, "logged", work_id)
    assert failure["level"] == "ERROR" and failure["time"].endswith("Z")


def test_watch_redraws_the_report(sqlite: Database) -> None:
    synth_set(sqlite, "w", problems=2, seed=1)
    configure_annotation(sqlite, "w", 2)
    frames: list[str] = []
    watch(sqlite, interval_s=0.01, queue_depth=lambda: 3, echo=frames.append, stop=lambda: len(frames) >= 2)
    assert len(frames) == 2
    assert all(f.startswith("\x1b[2J\x1b[H") and "broker queue: 3 messages" in f for f in frames)
    assert "abs-q" in frames[0] and "failed" in frames[0], "the rule and the trouble column are shown"


def test_status_shows_failed_and_retrying_items_with_the_last_error(sqlite: Database) -> None:
    from stepq.status import collect, render

    synth_set(sqlite, "t", problems=2, seed=1)
    configure_annotation(sqlite, "t", 2)
    with sqlite.session() as s:
        ids = jobs.pending_ids(s, ROLLOUT_WORK, 5)
    rt = worker_runtime(sqlite, WorkerOptions(name="x"), backend=_FailsAll())
    run_work_items(rt, ids[:1])
    Dispatcher(sqlite, outlets(lambda ids: None)).cycle()
    (row,) = collect(sqlite)["sets"]
    assert (row["failed"], row["retrying"]) == (1, 0)
    assert "HTTP 400" in row["last_error"]
    assert "t: last error: permanent: GenerationError: HTTP 400" in render(collect(sqlite))


def test_a_failed_job_is_logged_with_what_was_decided(sqlite: Database) -> None:
    """A transient failure on the job's last attempt was logged "will retry"."""
    import io
    import logging

    from stepq.workers.jobqueue.runner import fail
    from stepq.workers.kinds import ROLLOUTS

    synth_set(sqlite, "last", problems=1, seed=1)
    configure_annotation(sqlite, "last", 2)
    from sqlalchemy import text

    with sqlite.engine.begin() as conn:
        conn.execute(text("UPDATE rollout_work SET state = 'running', lease_owner = 'me', attempts = 99"))
        (job_id,) = conn.execute(text("SELECT id FROM rollout_work")).scalars().all()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("stepq")
    logger.addHandler(handler)
    try:
        assert fail(sqlite, ROLLOUTS, job_id, "me", TimeoutError("slow")) == "failed"
        assert fail(sqlite, ROLLOUTS, job_id, "me", TimeoutError("slow")) == "lost"
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert "failed (no attempts left): TimeoutError: slow" in lines[0] and "will retry" not in lines[0]
    assert "another worker holds it now" in lines[1]
