"""The pipeline through PostgreSQL + Redis + real `stepq worker` processes.

Covers: exact rollout counts and Q-values, the adaptive budget through a kill, two dispatchers
at once, the broker's bound, and Abs-Q label accuracy against the synthetic truth.  The fault
matrix (kills, outages, lost messages) is ``test_faults``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from sqlalchemy import bindparam, text

from stepq.models import Database
from stepq.workers.backends.synthetic_server import FailurePlan, SyntheticCompletionsServer
from tests.helpers import (
    Cluster,
    all_work_done,
    freeze_holding_a_lease,
    rollout_count,
    start_dispatcher,
    wait_for,
)
from tests.pipeline_checks import assert_exact, label_accuracy

pytestmark = pytest.mark.integration


def _prepare(cluster: Cluster, name: str, problems: int, m: int, *, seed: int = 1, latency: float = 0.0) -> None:
    cluster.cli("synth", "--set", name, "--problems", str(problems), "--seed", str(seed), "--latency-s", str(latency))
    cluster.cli("annotate", "--set", name, "--rollouts", str(m))


@pytest.mark.parametrize("backend", ["synthetic", "openai"])
def test_annotation_is_exact_through_the_queue(cluster: Cluster, pg: Database, backend: str) -> None:
    """60 problems, M = 8, two worker processes; with ``openai`` the workers generate through
    a real OpenAI-compatible server on loopback that fails its first requests (retried)."""
    _prepare(cluster, "exact", problems=60, m=8)
    extra: tuple[str, ...] = ()
    server = None
    if backend == "openai":
        server = SyntheticCompletionsServer(failures=FailurePlan(first=5, status=503)).start()
        extra = (
            "--backend",
            "openai",
            "--base-url",
            server.url,
            "--model",
            "synthetic",
            "--backend-option",
            "backoff_s=0.05",
        )
    try:
        cluster.start_worker("w1", *extra)
        cluster.start_worker("w2", *extra)
        start_dispatcher(cluster)
        wait_for(lambda: all_work_done(pg), 180, "all work done")
    finally:
        if server is not None:
            server.stop()
    total = assert_exact(pg, "exact", 8)
    if server is not None:
        assert server.requests == total + 5, "one request per sample, plus the 5 failed ones retried"
        with pg.engine.connect() as conn:
            generators = {g for (g,) in conn.execute(text("SELECT DISTINCT generator FROM rollouts"))}
        assert generators == {"openai:synthetic[t=1,p=1,max=8192]"}
    assert total > 60 * 3 * 8
    with pg.engine.connect() as conn:
        workers = {w for (w,) in conn.execute(text("SELECT DISTINCT worker FROM rollouts"))}
    assert len(workers) == 2, "both worker processes took work"
    status = cluster.cli("status", "--json").stdout
    import json

    row = json.loads(status)["sets"][0]
    assert row["rollouts_done"] == row["rollouts_planned"] == total
    assert row["labelled_chunks"] == row["chunks"]


def test_adaptive_budget_through_the_queue_survives_a_kill(cluster: Cluster, pg: Database, tmp_path: Path) -> None:
    """Adaptive rounds through real workers, one SIGKILLed mid-run, end exactly as an
    uninterrupted in-process run of the same set: same rollouts, same labels."""
    args = ("--problems", "40", "--seed", "3", "--latency-s", "0.003")
    cluster.cli("synth", "--set", "adapt", *args)
    cluster.cli("annotate", "--set", "adapt", "--rollouts", "16", "--budget", "adaptive", "--rule", "rel-effective")
    victim = cluster.start_worker("victim")
    start_dispatcher(cluster)
    wait_for(lambda: rollout_count(pg) > 150, 120, "the run to be under way")
    freeze_holding_a_lease(pg, victim, "victim")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    cluster.start_worker("rescuer")
    wait_for(lambda: all_work_done(pg), 240, "all work done after the kill")

    local = dict(cluster.env, STEPQ_DATABASE_URL=f"sqlite:///{tmp_path / 'local.db'}")
    for cmd in (
        ["synth", "--set", "adapt", *args],
        ["annotate", "--set", "adapt", "--rollouts", "16", "--budget", "adaptive", "--rule", "rel-effective"],
    ):
        subprocess.run([sys.executable, "-m", "stepq", *cmd], env=local, check=True, capture_output=True)
    from stepq.assembly import worker_runtime
    from stepq.workers.in_process import run_in_process
    from stepq.workers.jobqueue.runtime import WorkerOptions

    other = Database(local["STEPQ_DATABASE_URL"])
    run_in_process(other, worker_runtime(other, WorkerOptions(batch_rollouts=16, name="local")))
    query = (
        "SELECT p.external_id, r.prefix_len, r.sample_idx, r.reward FROM rollouts r "
        "JOIN trajectories t ON t.id = r.trajectory_id JOIN problems p ON p.id = t.problem_id"
    )
    labels = (
        "SELECT p.external_id, c.idx, l.rule, l.positive FROM chunk_labels l JOIN chunks c ON c.id = l.chunk_id "
        "JOIN trajectories t ON t.id = c.trajectory_id JOIN problems p ON p.id = t.problem_id"
    )
    with pg.engine.connect() as a, other.engine.connect() as b:
        assert sorted(a.execute(text(query)).all()) == sorted(b.execute(text(query)).all())
        got = {(e, i, r): bool(p) for e, i, r, p in a.execute(text(labels))}
        want = {(e, i, r): bool(p) for e, i, r, p in b.execute(text(labels))}
        chunks = a.execute(text("SELECT count(*) FROM chunks")).scalar_one()
        saved = a.execute(text("SELECT rollouts_saved FROM annotation_progress")).scalar_one()
    assert got == want and len(got) == chunks
    assert saved > 0
    with pg.engine.connect() as conn:
        by_worker = dict(
            conn.execute(text("SELECT split_part(worker, '@', 1), count(*) FROM rollouts GROUP BY 1")).all()
        )
    other.dispose()
    assert by_worker.get("victim", 0) > 0 and by_worker.get("rescuer", 0) > 0


def test_two_dispatchers_do_not_double_schedule(cluster: Cluster, pg: Database, redis_client: redis.Redis) -> None:
    _prepare(cluster, "twice", problems=40, m=4)
    args = [sys.executable, "-m", "stepq", "dispatch", "--once", "--wait", "60"]
    procs = [
        subprocess.Popen(
            args, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cluster.logs
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    published = sorted(int(out.split()[1]) for out, _ in outs)
    # No worker is live: the broker gets its floor, 2 messages of STEPQ_ITEMS_PER_TASK (4).
    bound = 2 * 4
    with pg.engine.connect() as conn:
        enqueued = conn.execute(text("SELECT sum(enqueue_count), max(enqueue_count) FROM rollout_work")).one()
        queued = sorted(i for (i,) in conn.execute(text("SELECT id FROM rollout_work WHERE state = 'queued'")))
    assert published == [0, bound]
    assert enqueued == (bound, 1)
    assert sorted(_message_ids(redis_client, cluster)) == queued, "every queued item is in exactly one message"


def test_the_broker_stays_bounded_under_a_long_backlog(
    cluster: Cluster, pg: Database, redis_client: redis.Redis
) -> None:
    """A backlog of 1500 items, a slow worker, a requeue interval far shorter than an item
    waits, a dispatcher cycling every 0.1 s: the Redis queue never holds more than its
    bound, no item is published twice, and the run still completes exactly."""
    cluster.env.update(
        {
            "STEPQ_REQUEUE_AFTER_S": "0.3",
            "STEPQ_DISPATCH_INTERVAL_S": "0.1",
            "STEPQ_ITEMS_PER_TASK": "2",
            "STEPQ_MESSAGES_PER_WORKER": "3",
        }
    )
    _prepare(cluster, "backlog", problems=1500, m=1, latency=0.002)
    queue = cluster.env["STEPQ_QUEUE"]
    cluster.start_worker("slow")
    start_dispatcher(cluster)
    depths: list[int] = []
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        depths.append(int(redis_client.llen(queue)))
        time.sleep(0.02)
    with pg.engine.connect() as conn:
        queued = conn.execute(text("SELECT count(*) FROM rollout_work WHERE state = 'queued'")).scalar_one()
        pending = conn.execute(text("SELECT count(*) FROM rollout_work WHERE state = 'pending'")).scalar_one()
    assert max(depths) > 0, "work was flowing"
    assert max(depths) <= 3, f"one live worker: at most 3 messages queued, saw {max(depths)}"
    assert queued <= 6 and pending > 500, "the backlog waits in the database, not in Redis"
    cluster.start_worker("fast1")
    cluster.start_worker("fast2")
    more: list[int] = []
    while not all_work_done(pg):
        more.append(int(redis_client.llen(queue)))
        assert len(more) < 20000, "the run did not finish"
        time.sleep(0.02)
    assert max(more) <= 9, f"three live workers: at most 9 messages queued, saw {max(more)}"
    assert_exact(pg, "backlog", 1)
    with pg.engine.connect() as conn:
        published = conn.execute(text("SELECT max(enqueue_count), sum(enqueue_count) FROM rollout_work")).one()
        n_items = conn.execute(text("SELECT count(*) FROM rollout_work")).scalar_one()
    assert published == (1, n_items), "every item was published exactly once"


PATHOLOGICAL = "so the answer is \\boxed{9^{9^{9^{9}}}}"  # sympy would compute it for ever


@pytest.mark.parametrize("pool", ["solo", "threads", "prefork"])
def test_grading_timeout_holds_in_every_pool(cluster: Cluster, pg: Database, pool: str) -> None:
    """A server answers every third sample with an answer math-verify cannot finish: in each
    pool the worker records a timeout and goes on.  (Before the fix, the threads pool had no
    limit and hung.)  The engine is built in the process that runs tasks: a prefork child."""
    server = SyntheticCompletionsServer(override=lambda _prompt, seed: PATHOLOGICAL if seed % 3 == 0 else None).start()
    cluster.env["STEPQ_GRADE_TIMEOUT_S"] = "1"
    try:
        _prepare(cluster, "patho", problems=2, m=2)
        proc = cluster.start_worker(
            "g", "--pool", pool, "--backend", "openai", "--base-url", server.url, "--model", "synthetic"
        )
        start_dispatcher(cluster)
        wait_for(lambda: all_work_done(pg), 120, f"all work done with the {pool} pool")
    finally:
        server.stop()
    assert_exact(pg, "patho", 2)
    with pg.engine.connect() as conn:
        methods = dict(conn.execute(text("SELECT grade_method, count(*) FROM rollouts GROUP BY 1")).all())
        pids = {int(w.split(":")[1]) for (w,) in conn.execute(text("SELECT DISTINCT worker FROM rollouts"))}
    assert methods.get("timeout", 0) >= 3 and None not in methods, methods
    if pool == "prefork":
        assert proc.pid not in pids, "the child that ran the task built its own engine"
    else:
        assert pids == {proc.pid}


def test_sigterm_hands_back_the_batch_and_exits_promptly(cluster: Cluster, pg: Database) -> None:
    """A scale-down (``docker compose stop``) sends SIGTERM: the worker commits the batch in
    flight, hands its items back and exits in about a batch's time, not a task's; another
    worker then finishes exactly."""
    cluster.env["STEPQ_ITEMS_PER_TASK"] = "2"
    _prepare(cluster, "term", problems=6, m=16, latency=0.05)  # a batch ~1.6 s, a task ~10 s
    proc = cluster.start_worker("leaving")
    start_dispatcher(cluster)
    freeze_holding_a_lease(pg, proc, "leaving")
    with pg.engine.connect() as conn:
        held = [i for (i,) in conn.execute(text("SELECT id FROM rollout_work WHERE state = 'running'"))]
    proc.send_signal(signal.SIGCONT)
    time.sleep(0.3)  # mid-batch
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    took = time.monotonic() - started
    assert took < 4.0, f"SIGTERM took {took:.1f}s; a whole task takes ~10 s"
    with pg.engine.connect() as conn:
        states = dict(
            conn.execute(
                text("SELECT id, state FROM rollout_work WHERE id IN :ids").bindparams(
                    bindparam("ids", expanding=True)
                ),
                {"ids": held},
            ).all()
        )
        alive = conn.execute(text("SELECT count(*) FROM workers WHERE stopped_at IS NULL")).scalar_one()
    assert set(states.values()) <= {"pending", "queued", "done"} and "pending" in states.values(), states
    assert alive == 0, "the worker said it stopped"
    cluster.start_worker("staying")
    wait_for(lambda: all_work_done(pg), 240, "all work done after the hand-back")
    assert_exact(pg, "term", 16)
    with pg.engine.connect() as conn:
        attempts = conn.execute(text("SELECT max(attempts) FROM rollout_work")).scalar_one()
    assert attempts == 1, "handing back is not a failed attempt"


def _message_ids(redis_client: redis.Redis, cluster: Cluster) -> list[int]:
    import base64
    import json

    messages = [json.loads(m) for m in redis_client.lrange(cluster.env["STEPQ_QUEUE"], 0, -1)]
    return [i for m in messages for i in json.loads(base64.b64decode(m["body"]))[0][0]]


def test_abs_q_labels_match_ground_truth(cluster: Cluster, pg: Database) -> None:
    _prepare(cluster, "truth", problems=150, m=16, seed=7)
    cluster.start_worker("w1")
    cluster.start_worker("w2")
    start_dispatcher(cluster)
    wait_for(lambda: all_work_done(pg), 240, "all work done")
    assert_exact(pg, "truth", 16)
    wrong_negative, right_positive, n_wrong, n_right = label_accuracy(pg, "truth")
    assert n_wrong >= 50 and n_right >= 200
    assert wrong_negative >= 0.90, wrong_negative
    assert right_positive >= 0.90, right_positive


def test_raising_the_budget_schedules_only_the_missing(cluster: Cluster, pg: Database) -> None:
    _prepare(cluster, "grow", problems=20, m=4)
    cluster.start_worker("w1")
    start_dispatcher(cluster)
    wait_for(lambda: all_work_done(pg), 120, "M=4 done")
    with pg.engine.connect() as conn:
        first = {r[0] for r in conn.execute(text("SELECT id FROM rollouts"))}
    cluster.cli("annotate", "--set", "grow", "--rollouts", "6")
    time.sleep(0.5)
    wait_for(lambda: all_work_done(pg), 120, "M=6 done")
    assert_exact(pg, "grow", 6)
    with pg.engine.connect() as conn:
        kept = {r[0] for r in conn.execute(text("SELECT id FROM rollouts WHERE sample_idx < 4"))}
    assert kept == first, "the first four samples per prefix were kept, not redone"


def test_a_worker_that_fails_every_job_stops_consuming_and_says_why(cluster: Cluster, pg: Database) -> None:
    """A worker whose backend cannot generate (a server that is not there) fails the jobs it
    takes one after another; after STEPQ_UNHEALTHY_AFTER of them it stops consuming, spends no
    more attempts, and shows as unhealthy with the last error in status and the metrics; a
    healthy worker then finishes the set exactly."""
    from stepq.metrics import StepqCollector

    cluster.env["STEPQ_UNHEALTHY_AFTER"] = "3"
    cluster.env["STEPQ_ITEMS_PER_TASK"] = "1"
    _prepare(cluster, "sick", problems=8, m=2)
    cluster.start_worker(
        "sick", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
        "--backend-option", "max_retries=0",
    )  # fmt: skip
    start_dispatcher(cluster)

    def unhealthy() -> bool:
        with pg.engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM workers WHERE unhealthy IS NOT NULL")).scalar_one() == 1

    wait_for(unhealthy, 120, "the failing worker to call itself unhealthy")

    def attempts() -> int:
        with pg.engine.connect() as conn:
            return int(conn.execute(text("SELECT coalesce(sum(attempts), 0) FROM rollout_work")).scalar_one())

    spent = attempts()
    time.sleep(8)  # several dispatcher cycles: lost messages republished, none taken by it
    assert attempts() == spent, "an unhealthy worker spends no more attempts"
    shown = cluster.cli("status").stdout
    assert "1 unhealthy" in shown and "worker sick takes no work: 3 jobs in a row failed" in shown, shown
    families = {f.name: f for f in StepqCollector(pg).collect()}
    states = {s.labels["state"]: s.value for s in families["stepq_workers"].samples}
    assert states["unhealthy"] == 1 and states["live"] == 0
    cluster.start_worker("well")
    wait_for(lambda: all_work_done(pg), 240, "the healthy worker to finish the set")
    assert_exact(pg, "sick", 2)
