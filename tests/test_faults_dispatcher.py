"""Faults of the dispatcher, on real PostgreSQL, Redis and ``stepq worker`` processes: killed
mid-run (its lock left behind) and frozen past its lock's lease while a standby takes over.
Each ends with exactly the rollouts of an uninterrupted run and no item left running."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
import redis

from stepq.models import Database
from tests.helpers import Cluster, all_work_done, rollout_count, start_dispatcher, wait_for
from tests.pipeline_checks import assert_exact, running_items

pytestmark = pytest.mark.integration


def _under_way(
    cluster: Cluster, pg: Database, set_name: str, *, problems: int, seed: int, past: int
) -> subprocess.Popen[bytes]:
    """A set annotated by one worker and a dispatcher named "first", past ``past`` rollouts."""
    cluster.cli("synth", "--set", set_name, "--problems", str(problems), "--seed", str(seed), "--latency-s", "0.004")
    cluster.cli("annotate", "--set", set_name, "--rollouts", "8")
    cluster.start_worker("w1")
    first = start_dispatcher(cluster, "first")
    wait_for(lambda: rollout_count(pg) > past, 120, "the run to be under way")
    return first


def test_a_killed_dispatcher_is_replaced_and_nothing_is_lost(cluster: Cluster, pg: Database) -> None:
    """The dispatcher SIGKILLed mid-run (its lock left behind): a second one waits for the lock
    to expire, takes over, recovers what the first had queued, and the set ends exact."""
    cluster.env["STEPQ_DB_LOCK_TIMEOUT_S"] = "2"  # the lock's lease: 14 s, not the default's 30 s of waiting
    first = _under_way(cluster, pg, "dk", problems=40, seed=6, past=200)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    assert not all_work_done(pg), "killed mid-run"
    second = start_dispatcher(cluster, "second")
    wait_for(lambda: all_work_done(pg), 300, "the second dispatcher to finish the run")
    assert second.poll() is None
    assert_exact(pg, "dk", 8)
    assert running_items(pg) == 0


def test_a_frozen_dispatcher_resumes_as_a_standby_and_publishes_nothing_stale(
    cluster: Cluster, pg: Database, redis_client: redis.Redis
) -> None:
    """A dispatcher frozen (SIGSTOP) mid-run past its lock's lease: a standby takes the lock and
    carries on; thawed, the old one publishes nothing (the broker's queue never exceeds its
    bound: 162 messages against 80 before) and waits as a standby; the set ends exact."""
    cluster.env["STEPQ_DB_LOCK_TIMEOUT_S"] = "2"  # the lock's lease: max(10, 5 x 0.3, 2 x 2 + 10) = 14 s
    # frozen inside a transaction, it holds its row locks until the server ends the session
    cluster.env["STEPQ_DB_IDLE_TRANSACTION_TIMEOUT_S"] = "5"
    first = _under_way(cluster, pg, "thaw", problems=60, seed=4, past=100)
    first.send_signal(signal.SIGSTOP)
    second = start_dispatcher(cluster, "second")
    log = cluster.logs / "second.log"
    wait_for(lambda: "published=" in log.read_text(), 60, "the standby to take the lock once its lease ran out")
    bound = int(log.read_text().rsplit("bound=", 1)[1].split(",")[0])
    first.send_signal(signal.SIGCONT)
    depth, deadline = 0, time.monotonic() + 8
    while time.monotonic() < deadline and not all_work_done(pg):
        depth = max(depth, int(redis_client.llen(cluster.env["STEPQ_QUEUE"])))
        time.sleep(0.02)
    assert depth <= bound, f"{depth} messages queued against a bound of {bound}"
    wait_for(lambda: all_work_done(pg), 240, "every item done")
    assert first.poll() is None and second.poll() is None
    thawed = (cluster.logs / "first.log").read_text()
    assert "dispatcher lock lost" in thawed or "another dispatcher holds the lock" in thawed, thawed[-2000:]
    assert_exact(pg, "thaw", 8)
    assert running_items(pg) == 0
