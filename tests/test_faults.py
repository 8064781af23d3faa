"""Faults a fleet must ride out, on real PostgreSQL, Redis and ``stepq worker`` processes:
each case ends with exactly the rollouts and labels of an uninterrupted run and no item left
running.  (More cases live beside the features they exercise: ``test_queue_integration``.)"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import text

from stepq.models import Database, queries
from tests.helpers import Cluster, wait_for
from tests.pipeline_checks import assert_exact

pytestmark = pytest.mark.integration


class PrivateRedis:
    """A Redis server of this test's own, on a free port, that the test may stop and start
    (the shared one stays up for the other tests)."""

    def __init__(self, workdir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(args, cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        wait_for(lambda: _pings(client), 30, "the private Redis to answer", interval=0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()


def _all_done(db: Database) -> bool:
    with db.session() as s:
        counts = queries.work_counts(s)
    return bool(counts) and set(counts) == {"done"}


def _rollouts(db: Database) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM rollouts")).scalar_one())


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
    wait_for(lambda: _rollouts(pg) > 300, 120, "the run to be under way")
    private_redis.stop()
    down_at = time.monotonic()
    cluster.cli("annotate", "--set", "outage", "--rollouts", "12")  # more work while the broker is down

    def logged(what: str) -> bool:
        return what in (cluster.logs / "dispatcher.log").read_text()

    wait_for(lambda: logged("broker unreachable"), 60, "the dispatcher to notice the outage")
    time.sleep(max(0.0, 10 - (time.monotonic() - down_at)))
    assert dispatcher.poll() is None, (cluster.logs / "dispatcher.log").read_text()[-2000:]
    private_redis.start()
    wait_for(lambda: _all_done(pg), 300, "every item done after the outage")
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
    wait_for(lambda: _all_done(pg), 180, "the healthy worker to finish the handed-back items")
    assert_exact(pg, "hang", 2)
