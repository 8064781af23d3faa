"""Rollouts per second through PostgreSQL + Redis + Celery vs. the same work in-process.

    python -m bench.ops.bench_queue [--problems 200] [--gpu-problems 60] [--workers 2] [--gpu-latency-s 0.01]

Three figures, taken in one run on the same synthetic set:
- ``in_process``: the backend and grader called in a loop, no database, no queue (1 process);
- ``embedded``: ``stepq run``'s path: the same task code writing to PostgreSQL, no broker;
- ``queue``: ``stepq dispatch`` + N ``stepq worker`` processes through Redis.

Two settings: zero generation cost (what the orchestration itself can sustain), and a
simulated GPU (``--gpu-latency-s`` per rollout; the design's GPU does ~40 rollouts/s,
i.e. 0.025 s, and the default 0.01 s is a faster one, which is harder on the queue).
The headline ratio is per worker: queue rollouts/s / workers / in-process rollouts/s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis
from sqlalchemy import text

from bench.common import REDIS_URL, emit, scratch_pg
from stepq.assembly import worker_runtime
from stepq.models import Database, queries
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.backends import GenerationRequest, SamplingParams, make_backend
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.grading.grader import Grader
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.seeds import derive_seed


def _prepare(url: str, problems: int, m: int, latency: float, *, plan: bool = True) -> Database:
    db = Database(url)
    synth_set(db, "bench", problems=problems, seed=1, latency_s=latency)
    if plan:
        _plan(db, m)
    return db


def _plan(db: Database, m: int) -> None:
    configure_annotation(db, "bench", m)


def in_process(db: Database, m: int, batch: int) -> tuple[int, float]:
    """Backend + grader only: the ceiling the queue is measured against."""
    with db.session() as s:
        pset = queries.get_set(s, "bench")
        contexts = [queries.load_work_context(s, tid) for tid in queries.set_trajectory_ids(s, pset.id)]
    backend = make_backend(pset.backend, pset.backend_config)
    grader = Grader()
    params = SamplingParams()
    done = 0
    start = time.perf_counter()
    for ctx in contexts:
        prefix = ctx.trajectory.prompt
        requests = []
        for k in range(ctx.trajectory.n_chunks):
            seeds = tuple(
                derive_seed(pset.seed, ctx.problem.external_id, ctx.trajectory.source_key, k, j) for j in range(m)
            )
            requests.append(GenerationRequest(prefix, seeds))
            prefix += ctx.chunks[k].text
        for part in range(0, len(requests), max(1, batch // m)):
            for comps in backend.generate(requests[part : part + max(1, batch // m)], params):
                for c in comps:
                    grader.grade(c.text, ctx.problem.reference_answer)
                    done += 1
    return done, time.perf_counter() - start


def embedded(db: Database, batch: int) -> tuple[int, float]:
    start = time.perf_counter()
    run_in_process(db, worker_runtime(db, WorkerOptions(batch_rollouts=batch, name="bench")))
    return _count(db), time.perf_counter() - start


def _count(db: Database) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM rollouts")).scalar_one())


def queue(
    db: Database, url: str, workers: int, batch: int, m: int, expected: int, settings: dict[str, str] | None = None
) -> tuple[int, float]:
    """Start the workers and the dispatcher first, then plan the work and time until done:
    steady-state throughput, not process start-up.  ``settings``: extra ``STEPQ_*`` values."""
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    env.update(
        {
            "STEPQ_DATABASE_URL": url,
            "STEPQ_BROKER_URL": REDIS_URL,
            "STEPQ_QUEUE": f"stepq.bench.{uuid.uuid4().hex[:6]}",
            "STEPQ_BATCH_ROLLOUTS": str(batch),
            "STEPQ_DISPATCH_INTERVAL_S": "0.2",
            "STEPQ_LOG_LEVEL": "WARNING",
            **(settings or {}),
        }
    )
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        logs = []
        for i in range(workers):
            log = Path(tmp) / f"w{i}.log"
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "stepq", "worker", "--name", f"bench{i}", "--loglevel", "INFO"],
                    env=env,
                    stdout=log.open("wb"),
                    stderr=subprocess.STDOUT,
                )
            )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "stepq", "dispatch"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        try:
            while not all("ready" in log.read_text(errors="replace") for log in logs) or not _dispatching(db):
                time.sleep(0.1)
            start = time.perf_counter()
            _plan(db, m)
            while True:
                with db.session() as s:
                    counts = queries.work_counts(s)
                if set(counts) == {"done"}:
                    break
                time.sleep(0.05)
            elapsed = time.perf_counter() - start
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=30)
    n = _count(db)
    assert n == expected, f"queue wrote {n} rollouts, expected {expected}"
    return n, elapsed


def _dispatching(db: Database) -> bool:
    with db.engine.connect() as conn:
        return bool(conn.execute(text("SELECT count(*) FROM locks WHERE name = 'dispatcher'")).scalar_one())


ABLATIONS = {
    "without_tail_split": {"STEPQ_SPLIT_TAIL": "false"},
    "without_write_behind": {"STEPQ_WRITE_BEHIND": "false"},
}
"""The queue again with one of its tail measures off (simulated GPU only): what each is worth."""


def measure(problems: int, m: int, workers: int, batch: int, latency: float, ablate: bool = False) -> dict[str, object]:
    result: dict[str, object] = {"latency_s": latency, "problems": problems}
    with scratch_pg() as url:
        db = _prepare(url, problems, m, latency)
        n, secs = in_process(db, m, batch)
        result["rollouts"] = n
        result["in_process_rollouts_per_s"] = round(n / secs, 1)
        if latency == 0:
            en, esecs = embedded(db, batch)
            assert en == n
            result["embedded_rollouts_per_s"] = round(en / esecs, 1)
        db.dispose()
    with scratch_pg() as url:
        db = _prepare(url, problems, m, latency, plan=False)
        qn, qsecs = queue(db, url, workers, batch, m, n)
        result["queue_rollouts_per_s"] = round(qn / qsecs, 1)
        db.dispose()
    q, base = float(result["queue_rollouts_per_s"]), float(result["in_process_rollouts_per_s"])  # type: ignore[arg-type]
    result["queue_vs_in_process"] = round(q / base, 3)
    result["queue_per_worker_vs_in_process"] = round(q / workers / base, 3)
    for name, settings in ABLATIONS.items() if ablate else ():
        with scratch_pg() as url:
            db = _prepare(url, problems, m, latency, plan=False)
            an, asecs = queue(db, url, workers, batch, m, n, settings)
            result[f"queue_per_worker_vs_in_process_{name}"] = round(an / asecs / workers / base, 3)
            db.dispose()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=200, help="problems for the zero-latency run")
    ap.add_argument("--gpu-problems", type=int, default=60, help="problems for the simulated-GPU run")
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument(
        "--gpu-latency-s",
        type=float,
        default=0.01,
        help="simulated GPU time per rollout (0.01 = 100 rollouts/s, 2.5x the design's GPU)",
    )
    args = ap.parse_args()
    overhead = measure(args.problems, args.rollouts, args.workers, args.batch, 0.0)
    print("orchestration only:", overhead, flush=True)
    gpu = measure(args.gpu_problems, args.rollouts, args.workers, args.batch, args.gpu_latency_s, ablate=True)
    print("simulated GPU:", gpu, flush=True)
    emit(
        {
            "workers": args.workers,
            "rollouts_per_prefix": args.rollouts,
            "cpus": os.cpu_count(),
            "orchestration_only": overhead,
            "simulated_gpu": gpu,
            "headline_queue_per_worker_vs_in_process": gpu["queue_per_worker_vs_in_process"],
            "target": 0.95,
        }
    )


if __name__ == "__main__":
    main()
