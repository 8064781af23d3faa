"""Work priority on a real fleet (PostgreSQL, Redis, ``stepq worker`` and ``stepq dispatch``
processes): the first items completed are the highest-priority ones; a worker SIGKILLed
mid-round and re-prioritising while workers run both end with exactly the rollouts of an
uninterrupted run, every item placed by a recorded round."""

from __future__ import annotations

import signal

import pytest
from sqlalchemy import text

from stepq.models import Database
from tests.helpers import Cluster, all_work_done, freeze_holding_a_lease, rollout_count, start_dispatcher, wait_for
from tests.pipeline_checks import assert_exact

pytestmark = pytest.mark.integration


def _placed(db: Database) -> list[tuple[float, int | None, float | None]]:
    """(priority, round, finished_at) of every item, in the order they finished."""
    with db.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT priority, priority_round_id, finished_at FROM rollout_work ORDER BY finished_at, id")
        )
        return [(float(p), r, f) for p, r, f in rows]


def test_the_first_completed_items_are_the_highest_priority_ones(cluster: Cluster, pg: Database) -> None:
    cluster.cli("synth", "--set", "p", "--problems", "30", "--seed", "3", "--latency-s", "0.002")
    out = cluster.cli("annotate", "--set", "p", "--rollouts", "2", "--priority", "random:seed=5").stdout
    assert "priority round 1: 1 scoring jobs queued" in out
    cluster.start_worker("w1")
    start_dispatcher(cluster)
    wait_for(lambda: all_work_done(pg), 180, "all work done")
    placed = _placed(pg)
    by_priority = sorted((p for p, _, _ in placed), reverse=True)
    first = [p for p, _, _ in placed[:5]]
    assert min(first) >= by_priority[7], f"first finished {first} are not among the top priorities {by_priority[:8]}"
    half = len(placed) // 2
    assert sum(p for p, _, _ in placed[:half]) > sum(p for p, _, _ in placed[half:])
    assert {r for _, r, _ in placed} == {1}, "every item placed by the recorded round"
    assert_exact(pg, "p", 2)


def test_a_worker_killed_mid_round_leaves_exact_results(cluster: Cluster, pg: Database) -> None:
    cluster.cli("synth", "--set", "k", "--problems", "40", "--seed", "4", "--latency-s", "0.004")
    cluster.cli("annotate", "--set", "k", "--rollouts", "8", "--priority", "random:seed=2")
    victim = cluster.start_worker("victim")
    start_dispatcher(cluster)
    wait_for(lambda: rollout_count(pg) > 200, 120, "the round to be under way")
    freeze_holding_a_lease(pg, victim, "victim")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    assert not all_work_done(pg)
    cluster.start_worker("rescuer")
    wait_for(lambda: all_work_done(pg), 240, "all work done after the kill")
    assert_exact(pg, "k", 8)
    assert {r for _, r, _ in _placed(pg)} == {1}


def test_reprioritising_while_workers_run_loses_and_duplicates_nothing(cluster: Cluster, pg: Database) -> None:
    cluster.cli("synth", "--set", "rp", "--problems", "50", "--seed", "5", "--latency-s", "0.004")
    cluster.cli("annotate", "--set", "rp", "--rollouts", "8", "--priority", "random:seed=1")
    cluster.start_worker("w1")
    cluster.start_worker("w2")
    start_dispatcher(cluster)
    for seed, after in ((2, 100), (3, 600), (4, 1200)):
        wait_for(lambda a=after: rollout_count(pg) > a, 120, f"{after} rollouts")  # type: ignore[misc]
        cluster.cli("annotate", "--set", "rp", "--rollouts", "8", "--priority", f"random:seed={seed}")
    wait_for(lambda: all_work_done(pg), 240, "all work done")
    assert_exact(pg, "rp", 8)
    rounds = {r for _, r, _ in _placed(pg)}
    assert rounds <= {1, 2, 3, 4} and len(rounds) >= 2, "items placed by several rounds, each recorded"
    with pg.engine.connect() as conn:
        unsettled = conn.execute(text("SELECT count(*) FROM priority_scorings WHERE state <> 'done'")).scalar_one()
    assert unsettled == 0
