"""The fault matrix: faults a fleet must ride out, on real PostgreSQL, Redis and ``stepq worker``
processes.  Each case ends with exactly the rollouts and labels of an uninterrupted run and no
item left running: a worker SIGKILLed; Redis stopped mid-run (the dispatcher's PID
unchanged); Redis flushed; one message lost while others wait; PostgreSQL restarted; every
database connection killed under tasks holding claimed items; a generate call that hangs; Redis
full (writes refused) for 15 s; 300 pending searches with no worker (the queue within its
bound); a resample under load; a worker with another model joining a set under way.  A host cut off from the network:
``tests/test_faults_host.py``; a host's clock: ``tests/test_faults_clock.py``; the dispatcher
killed or frozen: ``tests/test_faults_dispatcher.py``."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import text

from stepq.models import Database
from stepq.models.errors import BrokerError
from tests.helpers import (
    Cluster,
    all_work_done,
    freeze_holding_a_lease,
    rollout_count,
    start_dispatcher,
    wait_for,
)
from tests.pipeline_checks import assert_exact, running_items
from tests.services import PrivatePostgres, PrivateRedis

pytestmark = pytest.mark.integration


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A Redis of this test's own, which it stops and starts (the session's stays up)."""
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()


def test_a_broker_outage_stops_nothing_for_good(cluster: Cluster, pg: Database, private_redis: PrivateRedis) -> None:
    """Redis stopped for 10 s mid-run and started again (empty, as after a restart without
    persistence), the budget raised while it is down: the dispatcher keeps running (same
    process), waits the outage out, the worker reconnects, lost messages are published again,
    and the set ends exact."""
    cluster.env["STEPQ_BROKER_URL"] = private_redis.url
    cluster.env["STEPQ_MESSAGES_PER_WORKER"] = "100"  # room to publish the new set's work during the outage
    cluster.cli("synth", "--set", "outage", "--problems", "60", "--seed", "3", "--latency-s", "0.004")
    cluster.cli("annotate", "--set", "outage", "--rollouts", "8")
    cluster.start_worker("w1")
    log = (cluster.logs / "dispatcher.log").open("wb")
    dispatcher = subprocess.Popen(
        [sys.executable, "-m", "stepq", "dispatch"], env=cluster.env, stdout=log, stderr=subprocess.STDOUT
    )
    cluster.procs.append(dispatcher)
    wait_for(lambda: rollout_count(pg) > 300, 120, "the run to be under way")
    private_redis.stop()
    down_at = time.monotonic()
    cluster.cli("annotate", "--set", "outage", "--rollouts", "12")  # more work while the broker is down

    def logged(what: str) -> bool:
        return what in (cluster.logs / "dispatcher.log").read_text()

    wait_for(lambda: logged("broker unreachable"), 60, "the dispatcher to notice the outage")
    time.sleep(max(0.0, 10 - (time.monotonic() - down_at)))
    assert dispatcher.poll() is None, (cluster.logs / "dispatcher.log").read_text()[-2000:]
    private_redis.start()
    wait_for(lambda: all_work_done(pg), 300, "every item done after the outage")
    assert dispatcher.poll() is None, "the dispatcher rode out the outage in the same process"
    assert logged("reachable again")
    assert_exact(pg, "outage", 12)
    with pg.engine.connect() as conn:
        assert not conn.execute(text("SELECT count(*) FROM rollout_work WHERE state = 'running'")).scalar_one()


def test_a_hung_generate_call_hands_its_work_back_and_another_worker_finishes(cluster: Cluster, pg: Database) -> None:
    """An engine that stops answering (here: 60 s a rollout) would keep its items running for
    ever, their leases renewed by the heartbeat.  Past STEPQ_GENERATE_TIMEOUT_S the worker
    hands them back and exits 69; a healthy worker then finishes them exactly."""
    cluster.cli("synth", "--set", "hang", "--problems", "3", "--seed", "5", "--latency-s", "60")
    cluster.cli("annotate", "--set", "hang", "--rollouts", "2")
    hung_env = {**cluster.env, "STEPQ_GENERATE_TIMEOUT_S": "3"}
    log = (cluster.logs / "dispatcher.log").open("wb")
    cluster.procs.append(
        subprocess.Popen([sys.executable, "-m", "stepq", "dispatch"], env=cluster.env, stdout=log, stderr=log)
    )
    stuck_log = (cluster.logs / "stuck.log").open("wb")
    stuck = subprocess.Popen(
        [sys.executable, "-m", "stepq", "worker", "--name", "stuck"], env=hung_env, stdout=stuck_log, stderr=stuck_log
    )
    cluster.procs.append(stuck)
    assert stuck.wait(timeout=120) == 69, (cluster.logs / "stuck.log").read_text()[-2000:]
    assert "did not return within 3 s" in (cluster.logs / "stuck.log").read_text()
    with pg.engine.connect() as conn:
        running = conn.execute(text("SELECT count(*) FROM rollout_work WHERE state = 'running'")).scalar_one()
    assert running == 0, "the hung worker handed its items back"
    healthy = json.dumps({"error_rate": 0.1, "recovery_rate": 0.001, "latency_s": 0.0})
    with pg.engine.begin() as conn:  # the engine answers again (latency is not part of the generator)
        conn.execute(text("UPDATE problem_sets SET backend_config = :c"), {"c": healthy})
    cluster.start_worker("healthy")
    wait_for(lambda: all_work_done(pg), 180, "the healthy worker to finish the handed-back items")
    assert_exact(pg, "hang", 2)


def test_a_message_lost_while_the_queue_holds_others_is_published_again(
    cluster: Cluster, pg: Database, redis_client: redis.Redis
) -> None:
    """No worker yet: the dispatcher keeps the bound (2 messages) queued.  One message vanishes
    from Redis while the other still waits: the dispatcher, reading which jobs the broker's
    messages carry, publishes the lost one again (the queue never emptied), and nothing else
    twice; a worker then finishes the set exactly."""
    queue = cluster.env["STEPQ_QUEUE"]
    cluster.cli("synth", "--set", "lm", "--problems", "6", "--seed", "8")
    cluster.cli("annotate", "--set", "lm", "--rollouts", "2")
    start_dispatcher(cluster)
    wait_for(lambda: redis_client.llen(queue) == 2, 60, "the bound's two messages")
    raw = redis_client.lrange(queue, 0, 0)[0]
    lost = json.loads(base64.b64decode(json.loads(raw)["body"]))[0][0]
    redis_client.lrem(queue, 1, raw)

    def published_again() -> bool:
        with pg.engine.connect() as conn:
            counts = dict(conn.execute(text("SELECT id, enqueue_count FROM rollout_work")).all())
        return all(counts[i] == 2 for i in lost)

    wait_for(published_again, 60, "the lost message's items to be published again")
    assert redis_client.llen(queue) == 2, "republished into the same bound"
    with pg.engine.connect() as conn:
        twice = conn.execute(text("SELECT count(*) FROM rollout_work WHERE enqueue_count > 1")).scalar_one()
    assert twice == len(lost), "only the lost message's items went out twice"
    cluster.start_worker("w1")
    wait_for(lambda: all_work_done(pg), 180, "every item done")
    assert_exact(pg, "lm", 2)


def test_a_postgres_restart_mid_run_loses_nothing(cluster: Cluster, pg: Database, private_pg: PrivatePostgres) -> None:
    """PostgreSQL restarted under a running fleet: the dispatcher (same process) and the
    worker wait it out, leases that expired meanwhile are rescheduled, and the set ends exact.
    The server restarted is the suite's own, never the machine's."""
    cluster.cli("synth", "--set", "pr", "--problems", "40", "--seed", "9", "--latency-s", "0.004")
    cluster.cli("annotate", "--set", "pr", "--rollouts", "8")
    worker = cluster.start_worker("w1")
    dispatcher = start_dispatcher(cluster)
    wait_for(lambda: rollout_count(pg) > 200, 120, "the run to be under way")
    private_pg.restart()
    pg.engine.dispose()
    wait_for(lambda: all_work_done(pg), 300, "every item done after the restart")
    assert dispatcher.poll() is None and worker.poll() is None, "both rode the restart out"
    assert_exact(pg, "pr", 8)
    assert running_items(pg) == 0


def test_pending_searches_with_no_worker_stay_within_the_bound(
    cluster: Cluster, pg: Database, redis_client: redis.Redis
) -> None:
    """300 step searches and rollout work pending, no worker: the broker holds the bound
    (2 messages), not 300, over several dispatcher cycles."""
    queue = cluster.env["STEPQ_QUEUE"]
    cluster.cli("synth", "--set", "sb", "--problems", "300", "--seed", "2")
    cluster.cli("search", "start", "--set", "sb", "--name", "n")
    cluster.cli("annotate", "--set", "sb", "--rollouts", "2")
    start_dispatcher(cluster)
    wait_for(lambda: redis_client.llen(queue) == 2, 60, "the bound's two messages")
    deepest = 0
    for _ in range(10):  # ~10 cycles at 0.3 s
        time.sleep(0.3)
        deepest = max(deepest, int(redis_client.llen(queue)))
    assert deepest == 2
    with pg.engine.connect() as conn:
        queued = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM step_searches WHERE state = 'queued')"
                " + (SELECT count(*) FROM rollout_work WHERE state = 'queued')"
            )
        ).scalar_one()
    assert queued == 2


def test_tasks_whose_database_connections_die_release_what_they_claimed(cluster: Cluster, pg: Database) -> None:
    """Every database connection of the fleet is killed mid-task, three times (a failover, a
    pooler restart): the exceptions escape tasks that hold claimed items.  With leases of
    300 s, an item left running would stall the set for five minutes; it ends within two, so
    each task released what it claimed (an attempt counted, a short backoff), and exactly."""
    cluster.env.update(STEPQ_LEASE_TTL_S="300", STEPQ_ITEMS_PER_TASK="4", STEPQ_RETRY_BACKOFF_S="0.5")
    cluster.cli("synth", "--set", "dc", "--problems", "24", "--seed", "10", "--latency-s", "0.01")
    cluster.cli("annotate", "--set", "dc", "--rollouts", "6")
    worker = cluster.start_worker("w1")
    start_dispatcher(cluster)
    killer = Database(str(pg.engine.url.render_as_string(hide_password=False)))
    try:
        for threshold in (60, 200, 400):
            wait_for(lambda t=threshold: rollout_count(pg) > t, 120, "the run to be under way")  # type: ignore[misc]
            with killer.engine.begin() as conn:
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                )
            pg.engine.dispose()
    finally:
        killer.dispose()
    wait_for(lambda: all_work_done(pg), 120, "every item done, well inside the 300 s lease")
    assert worker.poll() is None, "the worker rode it out"
    assert_exact(pg, "dc", 6)
    assert running_items(pg) == 0


def test_sigkill_worker_mid_run_loses_and_duplicates_nothing(cluster: Cluster, pg: Database) -> None:
    cluster.cli("synth", "--set", "kill", "--problems", "50", "--seed", "1", "--latency-s", "0.004")
    cluster.cli("annotate", "--set", "kill", "--rollouts", "8")
    victim = cluster.start_worker("victim")
    start_dispatcher(cluster)
    wait_for(lambda: rollout_count(pg) > 300, 120, "the run to be under way")
    freeze_holding_a_lease(pg, victim, "victim")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    assert not all_work_done(pg)
    cluster.start_worker("rescuer")
    wait_for(lambda: all_work_done(pg), 240, "all work done after the kill")
    assert_exact(pg, "kill", 8)
    with pg.engine.connect() as conn:
        retried = conn.execute(text("SELECT count(*) FROM rollout_work WHERE attempts > 1")).scalar_one()
        by_worker = dict(
            conn.execute(text("SELECT split_part(worker, '@', 1), count(*) FROM rollouts GROUP BY 1")).all()
        )
    assert retried >= 1, "the killed worker's item was rescheduled after its lease expired"
    assert by_worker.get("victim", 0) > 0 and by_worker.get("rescuer", 0) > 0


def test_flushed_broker_mid_run_is_rescheduled(cluster: Cluster, pg: Database, redis_client: redis.Redis) -> None:
    cluster.cli("synth", "--set", "flush", "--problems", "50", "--seed", "1", "--latency-s", "0.003")
    cluster.cli("annotate", "--set", "flush", "--rollouts", "8")
    cluster.start_worker("w1")
    start_dispatcher(cluster)
    wait_for(lambda: rollout_count(pg) > 200, 120, "the run to be under way")
    queue = cluster.env["STEPQ_QUEUE"]
    assert redis_client.llen(queue) > 0, "messages were waiting when the broker lost them"
    redis_client.flushdb()
    assert redis_client.llen(queue) == 0
    wait_for(lambda: all_work_done(pg), 240, "all work done after the flush")
    assert_exact(pg, "flush", 8)
    with pg.engine.connect() as conn:
        republished = conn.execute(text("SELECT count(*) FROM rollout_work WHERE enqueue_count > 1")).scalar_one()
    assert republished >= 1


FREEZE_MID_TRANSACTION = """
import os, signal, sys
from sqlalchemy import text
from stepq.models import Database
from stepq.models.db import SessionGuards
from stepq.models.errors import BrokerError
from stepq.settings import Settings

settings = Settings.from_env()
db = Database(settings.database_url, guards=settings.session_guards())
with db.session() as s:  # what a worker holds inside a claim: the set's row and its work rows
    s.execute(text("SELECT id FROM problem_sets WHERE name = :n FOR UPDATE"), {"n": sys.argv[1]})
    s.execute(
        text("UPDATE rollout_work SET attempts = attempts WHERE problem_set_id = "
             "(SELECT id FROM problem_sets WHERE name = :n)"),
        {"n": sys.argv[1]},
    )
    print("locked", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # a paused VM: the transaction stays open
"""


def test_a_frozen_transaction_does_not_stall_the_fleet(cluster: Cluster, pg: Database) -> None:
    """A process frozen with its transaction open held its row locks for as long as it stayed
    frozen, and every dispatcher and worker that needed them waited with it.  The server now
    ends a session idle inside a transaction (``STEPQ_DB_IDLE_TRANSACTION_TIMEOUT_S``, here
    5 s for the frozen one), its locks go, and the rest of the fleet finishes the set exactly."""
    cluster.cli("synth", "--set", "fz", "--problems", "30", "--seed", "4", "--latency-s", "0.004")
    cluster.cli("annotate", "--set", "fz", "--rollouts", "8")  # its work rows exist now
    env = {**cluster.env, "STEPQ_DB_IDLE_TRANSACTION_TIMEOUT_S": "5"}
    frozen = subprocess.Popen(
        [sys.executable, "-c", FREEZE_MID_TRANSACTION, "fz"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert frozen.stdout is not None and frozen.stdout.readline().strip() == "locked"
        cluster.start_worker("healthy")
        start_dispatcher(cluster)
        wait_for(lambda: all_work_done(pg), 180, "the fleet to finish beside a frozen transaction")
        assert frozen.poll() is None, "still frozen: the fleet finished without it"
        assert_exact(pg, "fz", 8)
    finally:
        frozen.kill()
        frozen.wait(timeout=10)


def test_after_a_postgres_restart_nothing_waits_for_its_lease(
    pg: Database, cluster: Cluster, private_pg: PrivatePostgres
) -> None:
    """With 300 s leases, items whose task died while PostgreSQL was restarting sat running
    with no worker on them until their leases expired.  A task that cannot write its release
    now owes it to the worker's heartbeat, which writes it once the database answers: the set
    ends well inside one lease."""
    long_leases = Cluster({**cluster.env, "STEPQ_LEASE_TTL_S": "300", "STEPQ_HEARTBEAT_S": "1"}, cluster.logs)
    try:
        long_leases.cli("synth", "--set", "rl", "--problems", "40", "--seed", "3", "--latency-s", "0.004")
        long_leases.cli("annotate", "--set", "rl", "--rollouts", "8")
        worker = long_leases.start_worker("w1")
        dispatcher = start_dispatcher(long_leases)
        wait_for(lambda: rollout_count(pg) > 200, 120, "the run to be under way")
        private_pg.restart()
        pg.engine.dispose()
        restarted = time.monotonic()
        wait_for(lambda: all_work_done(pg), 150, "every item done well inside one 300 s lease")
        assert time.monotonic() - restarted < 150
        assert dispatcher.poll() is None and worker.poll() is None
        assert_exact(pg, "rl", 8)
        assert running_items(pg) == 0
    finally:
        long_leases.stop()


def test_a_publish_that_fails_part_way_sends_no_message_twice(pg: Database, private_redis: PrivateRedis) -> None:
    """Redis at its memory limit mid-publish: the messages that reached it stay queued and only
    the rest go back to pending, so once Redis has room every job has exactly one message (853
    messages for 600 jobs before: the sent ones were put back and published again)."""
    from stepq.workers.annotation_plans import configure_annotation
    from stepq.workers.celery_app import create_app, outlets
    from stepq.workers.celery_options import CeleryOptions
    from stepq.workers.data.synthetic_set import synth_set
    from stepq.workers.jobqueue.dispatcher import Dispatcher, DispatchOptions

    synth_set(pg, "full", problems=1000, seed=2)
    configure_annotation(pg, "full", 4)
    queue = f"stepq.test.full.{os.getpid()}"
    app = create_app(CeleryOptions(broker_url=private_redis.url, queue=queue))
    dispatcher = Dispatcher(
        pg, outlets(app, 1), options=DispatchOptions(messages_per_worker=None, split_tail=False), name="full"
    )
    client = redis.Redis.from_url(private_redis.url)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 600_000)  # room for some
    assert dispatcher.acquire()
    with pytest.raises(BrokerError, match="jobs published"):
        dispatcher.cycle()

    def in_broker() -> list[int]:
        return [
            i
            for raw in client.lrange(queue, 0, -1)
            for i in json.loads(base64.b64decode(json.loads(raw)["body"]))[0][0]
        ]

    def queued() -> int:
        with pg.engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM rollout_work WHERE state = 'queued'")).scalar_one()

    sent = in_broker()
    assert 0 < len(sent) < 1000, "the limit was hit part-way"
    assert queued() == len(sent) == len(set(sent))
    client.config_set("maxmemory", 0)
    dispatcher.cycle()
    everything = in_broker()
    assert len(everything) == len(set(everything)) == 1000 == queued()
    dispatcher.release()


def _generators(pg: Database) -> set[str]:
    with pg.engine.connect() as conn:
        return {g for (g,) in conn.execute(text("SELECT DISTINCT generator FROM rollouts"))}


def test_a_resample_under_load_leaves_only_the_new_sampling(cluster: Cluster, pg: Database) -> None:
    """``annotate --resample`` with a new temperature while two workers sample the set: every
    batch sampled the old way that lands after it is refused, the set ends exact under the new
    sampling alone, nothing failed or stuck, no attempt spent on a refused batch."""
    cluster.cli("synth", "--set", "rs", "--problems", "40", "--seed", "2", "--latency-s", "0.004")
    cluster.cli("annotate", "--set", "rs", "--rollouts", "8")
    cluster.start_worker("w1")
    cluster.start_worker("w2")
    start_dispatcher(cluster)
    wait_for(lambda: rollout_count(pg) > 400, 120, "the run to be under way")
    cluster.cli("annotate", "--set", "rs", "--rollouts", "8", "--temperature", "0.7", "--resample")
    wait_for(lambda: all_work_done(pg), 300, "all work done after the resample")
    (generator,) = _generators(pg)
    assert "t=0.7" in generator, generator
    assert_exact(pg, "rs", 8, discarded=True)
    with pg.engine.connect() as conn:
        states = dict(conn.execute(text("SELECT state, count(*) FROM rollout_work GROUP BY state")).all())
    assert set(states) == {"done"}, states


def test_a_worker_with_another_model_never_splits_a_set(cluster: Cluster, pg: Database) -> None:
    """A worker whose policy differs (another error rate: another model, as far as the labels
    go) is the first on a set nothing has pinned yet: it refuses the set's work (its config
    names the policy), says so in `stepq status`, spends no attempt, writes nothing; the
    matching worker joins later and the set ends exact under its generator alone."""
    cluster.cli("synth", "--set", "one", "--problems", "40", "--seed", "4", "--latency-s", "0.004")
    cluster.cli("annotate", "--set", "one", "--rollouts", "8")
    cluster.start_worker("odd", "--backend", "synthetic", "--backend-option", "error_rate=0.3")
    start_dispatcher(cluster)

    def refused() -> bool:
        with pg.engine.connect() as conn:
            return bool(conn.execute(text("SELECT count(*) FROM workers WHERE refused IS NOT NULL")).scalar_one())

    wait_for(refused, 120, "the odd worker to refuse the set's work")
    assert rollout_count(pg) == 0, "the odd worker, first and alone, wrote nothing (it did not pin the set)"
    cluster.start_worker("right")
    wait_for(lambda: all_work_done(pg), 300, "all work done by the matching worker")
    assert len(_generators(pg)) == 1 and "err=0.3" not in next(iter(_generators(pg)))
    assert_exact(pg, "one", 8)
    assert "odd refuses work: set 'one' names synthetic(err=0.1" in cluster.cli("status").stdout
    with pg.engine.connect() as conn:
        spent = conn.execute(text("SELECT max(attempts) FROM rollout_work")).scalar_one()
    assert spent == 1, "a refusal spends no attempt"


def test_a_full_broker_is_ridden_out_by_every_worker(
    cluster: Cluster, pg: Database, private_redis: PrivateRedis
) -> None:
    """Redis at its memory limit (no eviction) for 15 s mid-run: every write is refused, the
    transport's fetch included.  The workers and the dispatcher stay up (same processes), say so
    and carry on once Redis has room; the set ends exact."""
    cluster.env["STEPQ_BROKER_URL"] = private_redis.url
    cluster.cli("synth", "--set", "full", "--problems", "60", "--seed", "3", "--latency-s", "0.004")
    cluster.cli("annotate", "--set", "full", "--rollouts", "8")
    workers = [cluster.start_worker(f"w{i}") for i in (1, 2)]
    dispatcher = start_dispatcher(cluster)
    wait_for(lambda: rollout_count(pg) > 200, 120, "the run to be under way")
    client = redis.Redis.from_url(private_redis.url)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)  # below what it holds: every write refused
    time.sleep(15)
    alive = [p.poll() is None for p in (*workers, dispatcher)]
    client.config_set("maxmemory", 0)
    logs = {p.name: p.read_text() for p in cluster.logs.glob("*.log")}
    assert all(alive), {k: v[-1500:] for k, v in logs.items()}
    wait_for(lambda: all_work_done(pg), 240, "every item done once the broker has room")
    assert all(p.poll() is None for p in (*workers, dispatcher)), "the same processes rode it out"
    assert_exact(pg, "full", 8)
    assert running_items(pg) == 0
