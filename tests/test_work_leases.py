"""Work items, leases and the dispatcher's bookkeeping, on both dialects."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
from sqlalchemy import update

from stepq.assembly import worker_runtime
from stepq.models import Database, RolloutWork, jobs, queries
from stepq.models.work import ROLLOUT_WORK
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.jobqueue.dispatcher import Dispatcher, DispatchOptions
from stepq.workers.jobqueue.job_kind import RetryPolicy
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.kinds import ROLLOUTS
from stepq.workers.labelling.rollout_handler import next_batch, run_work_item
from tests.helpers import outlets


def _setup(db: Database, problems: int = 3, m: int = 2) -> None:
    synth_set(db, "w", problems=problems, seed=2)
    with db.session() as s:
        pset = queries.get_set(s, "w")
        pset.rollouts_per_prefix = m
        s.flush()
        queries.plan_work(s, pset.id)


def test_next_batch_takes_whole_prefixes_in_order() -> None:
    requests = {2: list(range(7)), 0: [0, 1, 2], 1: [0, 1, 2]}
    assert next_batch(requests, 4) == [(0, [0, 1, 2]), (1, [0])]
    assert next_batch(requests, 100) == [(0, [0, 1, 2]), (1, [0, 1, 2]), (2, list(range(7)))]
    assert next_batch({}, 8) == []


def test_claim_is_exclusive_until_the_lease_expires(any_db: Database) -> None:
    _setup(any_db)
    with any_db.session() as s:
        wid = jobs.pending_ids(s, ROLLOUT_WORK, 1)[0]
        assert jobs.claim(s, ROLLOUT_WORK, wid, "a", ttl=60)
        assert not jobs.claim(s, ROLLOUT_WORK, wid, "b", ttl=60)
        s.execute(update(RolloutWork).where(RolloutWork.id == wid).values(lease_expires_at=0))
        assert jobs.claim(s, ROLLOUT_WORK, wid, "b", ttl=60)
        item = s.get(RolloutWork, wid, populate_existing=True)
        assert item is not None and item.lease_owner == "b" and item.attempts == 2
        assert not jobs.renew(s, ROLLOUT_WORK, [wid], "a", 60), "the old owner lost it"
        assert not jobs.finish(s, ROLLOUT_WORK, wid, "a")
        assert jobs.finish(s, ROLLOUT_WORK, wid, "b")
        assert not jobs.claim(s, ROLLOUT_WORK, wid, "c", ttl=60), "done work is not claimed again"


def test_a_redelivered_task_is_a_no_op(any_db: Database) -> None:
    _setup(any_db)
    rt = worker_runtime(any_db, WorkerOptions(name="x"))
    with any_db.session() as s:
        wid = jobs.pending_ids(s, ROLLOUT_WORK, 1)[0]
    assert run_work_item(rt, wid).status == "done"
    assert run_work_item(rt, wid).status == "skipped"


def test_concurrent_deliveries_write_each_rollout_once(pg: Database) -> None:
    _setup(pg, problems=1, m=6)
    with pg.session() as s:
        wid = jobs.pending_ids(s, ROLLOUT_WORK, 1)[0]
    results: list[str] = []

    def deliver(name: str) -> None:
        results.append(run_work_item(worker_runtime(pg, WorkerOptions(name=name, batch_rollouts=4)), wid).status)

    threads = [threading.Thread(target=deliver, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results).count("done") == 1 and results.count("skipped") == 3
    from tests.pipeline_checks import assert_exact

    assert_exact(pg, "w", 6)


def test_expired_leases_are_rescheduled_and_give_up_after_max_attempts(any_db: Database) -> None:
    _setup(any_db, problems=1)
    published: list[int] = []
    d = Dispatcher(any_db, outlets(published.extend, retry=RetryPolicy(max_attempts=2)))
    assert d.cycle().published == 1
    wid = published[0]
    with any_db.session() as s:
        jobs.claim(s, ROLLOUT_WORK, wid, "dead", ttl=-1)
    report = d.cycle()
    assert (report.expired, report.published) == (1, 1)
    with any_db.session() as s:
        jobs.claim(s, ROLLOUT_WORK, wid, "dead-again", ttl=-1)
    report = d.cycle()
    assert (report.failed, report.published) == (1, 0)
    with any_db.session() as s:
        assert queries.work_counts(s) == {"failed": 1}


def test_queued_items_are_republished_when_the_broker_is_empty(any_db: Database) -> None:
    _setup(any_db, problems=2)
    published: list[int] = []
    depth: list[int | None] = [5]
    d = Dispatcher(
        any_db,
        outlets(published.extend),
        queue_depth=lambda: depth[0],
        options=DispatchOptions(lost_grace_s=0.0, requeue_after_s=3600),
    )
    assert d.cycle().published == 2
    assert d.cycle().published == 0, "messages still in the broker: nothing to do"
    depth[0] = 0
    report = d.cycle()
    assert (report.requeued, report.published) == (2, 2)
    depth[0] = None
    assert d.cycle().published == 0, "unknown depth: wait for requeue_after"


def test_a_lost_message_is_found_while_the_queue_holds_other_work(any_db: Database) -> None:
    """The broker says which jobs its messages carry: a queued item none carries is lost and
    published again, even though the queue is not empty; the items still carried are not
    published twice."""
    _setup(any_db, problems=3)
    published: list[int] = []
    carried: dict[str, set[int]] = {}
    d = Dispatcher(
        any_db,
        outlets(published.extend),
        queue_depth=lambda: 2,
        in_broker=lambda: carried,
        options=DispatchOptions(lost_grace_s=0.0, requeue_after_s=3600, messages_per_worker=None),
    )
    assert d.cycle().published == 3
    first, second, third = published
    carried[ROLLOUTS.task_name] = {first, third}  # the message of `second` is gone
    report = d.cycle()
    assert (report.requeued, report.published) == (1, 1) and published[3:] == [second]
    carried[ROLLOUTS.task_name] = {first, second, third}
    assert d.cycle().published == 0, "every queued item has its message: nothing republished"
    with any_db.session() as s:
        assert jobs.queued_count(s, ROLLOUT_WORK) == 3


def test_publish_failure_puts_items_back_to_pending(any_db: Database) -> None:
    _setup(any_db, problems=2)

    def broken(ids: Sequence[int]) -> None:
        raise ConnectionError("broker down")

    from stepq.models.errors import BrokerError

    d = Dispatcher(any_db, outlets(broken))
    try:
        d.cycle()
        raise AssertionError("expected BrokerError")
    except BrokerError as exc:
        assert "broker down" in str(exc)
    with any_db.session() as s:
        assert queries.work_counts(s) == {"pending": 2}


def test_only_one_dispatcher_holds_the_lock(any_db: Database) -> None:
    a = Dispatcher(any_db, outlets(lambda ids: None), name="a")
    b = Dispatcher(any_db, outlets(lambda ids: None), name="b")
    assert a.acquire() and a.acquire(), "renewable by its owner"
    assert not b.acquire()
    from stepq.models.errors import Busy

    started = time.monotonic()
    with pytest.raises(Busy, match=r"another dispatcher \(a@?.*\) holds the lock"):
        b.run(once=True, wait_s=0.5)  # waited, then gave up: exit 75, not 0 as if nothing were to do
    assert time.monotonic() - started >= 0.5
    with pytest.raises(Busy):
        b.run(once=True)  # --once alone does not wait (it hung while another held the lock)
    assert Busy.exit_code == 75
    a.release()
    assert b.acquire()


def test_a_messages_contexts_load_together_as_each_alone(any_db: Database) -> None:
    """The bulk loader a task uses reads what the one-trajectory loader reads: chunks in
    order, every stored reward, the generator, the problem and its set."""
    _setup(any_db, problems=4, m=2)
    rt = worker_runtime(any_db, WorkerOptions(name="w"))
    with any_db.session() as s:
        ids = jobs.pending_ids(s, ROLLOUT_WORK, 10)
    run_work_item(rt, ids[0])  # one trajectory has rollouts (and a generator)
    rt.close()
    with any_db.session() as s:
        trajectory_of = queries.work_trajectories(s, ids)
        tids = [trajectory_of[w] for w in ids]
        together = queries.load_work_contexts(s, tids)
        for tid in tids:
            alone = queries.load_work_context(s, tid)
            got = together[tid]
            assert (got.trajectory.id, got.problem.id, got.problem_set.id) == (
                alone.trajectory.id,
                alone.problem.id,
                alone.problem_set.id,
            )
            assert [c.idx for c in got.chunks] == [c.idx for c in alone.chunks] == sorted(c.idx for c in got.chunks)
            assert len(got.chunks) == got.trajectory.n_chunks
            assert (got.rewards, got.generator) == (alone.rewards, alone.generator)
        assert sum(1 for t in tids if together[t].rewards) == 1 and together[tids[0]].generator is not None
