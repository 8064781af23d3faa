"""The tail of a backlog: smaller messages as a set drains, and the bound still counted in
messages (``workers/jobqueue/message_split.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from stepq.models import Database, jobs, queries
from stepq.models.work import ROLLOUT_WORK
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.jobqueue.dispatcher import Dispatcher, DispatchOptions
from stepq.workers.jobqueue.message_split import SmallMessages, split_messages, tail_threshold
from tests.helpers import outlets


def test_a_long_backlog_goes_out_in_full_messages() -> None:
    ids = list(range(40))
    assert split_messages(ids, 4, 2, complete=False) == [ids[i : i + 4] for i in range(0, 40, 4)]
    # complete, but at least share * workers * per (2 * 2 * 4 = 16) left: still full
    assert [len(m) for m in split_messages(ids[:16], 4, 2, complete=True)] == [4, 4, 4, 4]


def test_the_tail_shrinks_by_guided_self_scheduling() -> None:
    # 15 left, 2 workers, share 2: ceil(15/4)=4, ceil(11/4)=3, ceil(8/4)=2, ceil(6/4)=2,
    # ceil(4/4)=1, then 1, 1, 1
    messages = split_messages(list(range(15)), 4, 2, complete=True)
    assert [len(m) for m in messages] == [4, 3, 2, 2, 1, 1, 1, 1]
    assert [i for m in messages for i in m] == list(range(15)), "every job once, in order"
    # 3 workers: ceil(11/6)=2, ceil(9/6)=2, ceil(7/6)=2, ceil(5/6)=1 ...
    assert [len(m) for m in split_messages(list(range(11)), 4, 3, complete=True)] == [2, 2, 2, 1, 1, 1, 1, 1]


def test_nothing_to_balance_with_one_worker_or_single_job_messages() -> None:
    assert tail_threshold(4, 1) == 0 and tail_threshold(1, 8) == 0 and tail_threshold(4, 2) == 16
    assert [len(m) for m in split_messages(list(range(7)), 4, 1, complete=True)] == [4, 3]
    assert [len(m) for m in split_messages(list(range(3)), 1, 5, complete=True)] == [1, 1, 1]


def test_small_messages_count_as_messages_until_their_jobs_are_taken() -> None:
    small = SmallMessages()
    small.add("t", [[1, 2, 3, 4], [5, 6], [7], [8]], per_message=4)  # the full one is not tracked
    assert small.tracks("t") and not small.tracks("other")
    # queued: 1..4 (one full message), 5 (its message's 6 was taken), 7, 8
    assert small.count("t", [1, 2, 3, 4, 5, 7, 8], 4) == 1 + 3
    assert small.count("t", [1, 2, 3, 4], 4) == 1, "the small ones were all taken"
    assert not small.tracks("t"), "and forgotten"


def _live_workers(db: Database, n: int) -> None:
    with db.session() as s:
        for i in range(n):
            queries.heartbeat(s, f"w{i}", hostname="h", pid=i, backend="synthetic")


def _messages(calls: Sequence[Sequence[int]], per: int) -> list[list[int]]:
    """A publish call is split into messages of ``per`` ids (the publishers' contract)."""
    return [list(c[i : i + per]) for c in calls for i in range(0, len(c), per)]


def _take(db: Database, ids: Sequence[int]) -> None:
    with db.session() as s:
        for i in ids:
            assert jobs.claim(s, ROLLOUT_WORK, i, "w0", 300.0)


def test_the_dispatcher_splits_the_tail_and_keeps_its_bound_in_messages(sqlite: Database) -> None:
    """24 trajectories, 4 to a message, 2 live workers (bound 4 messages): the first 16 go in
    4 full messages; once workers take them, the last 8 go in smaller ones (2, 2, 1, 1, 1, 1)
    never more than 4 messages queued, and every trajectory published exactly once."""
    synth_set(sqlite, "tail", problems=24, seed=1)
    configure_annotation(sqlite, "tail", 4)
    _live_workers(sqlite, 2)
    calls: list[list[int]] = []
    d = Dispatcher(sqlite, outlets(lambda ids: calls.append(list(ids)), per_message=4), options=DispatchOptions())
    d.cycle()
    first = _messages(calls, 4)
    assert [len(m) for m in first] == [4, 4, 4, 4], "16 of 24 pending: a long backlog still"
    calls.clear()
    _take(sqlite, first[0] + first[1])  # two messages taken: room for two more
    d.cycle()
    second = _messages(calls, 4)
    # 8 pending < 16: ceil(8/4)=2, ceil(6/4)=2 (only two messages fit the bound)
    assert [len(m) for m in second] == [2, 2]
    calls.clear()
    d.cycle()
    assert calls == [], "4 messages queued (two full, two small): the bound is full"
    _take(sqlite, first[2] + second[0])  # a full and a small message taken
    d.cycle()
    third = _messages(calls, 4)
    assert [len(m) for m in third] == [1, 1], "4 left: ceil(4/4)=1 each, two fit"
    calls.clear()
    _take(sqlite, first[3] + second[1] + third[0] + third[1])
    d.cycle()
    last = _messages(calls, 4)
    assert [len(m) for m in last] == [1, 1]
    everything = [i for m in first + second + third + last for i in m]
    with sqlite.session() as s:
        assert jobs.pending_ids(s, ROLLOUT_WORK, 100) == [], "nothing left behind"
    assert len(everything) == len(set(everything)) == 24, "each trajectory in exactly one message"


def test_splitting_the_tail_can_be_turned_off(sqlite: Database) -> None:
    synth_set(sqlite, "tail", problems=10, seed=1)
    configure_annotation(sqlite, "tail", 4)
    _live_workers(sqlite, 2)
    calls: list[list[int]] = []
    off = DispatchOptions(split_tail=False)
    Dispatcher(sqlite, outlets(lambda ids: calls.append(list(ids)), per_message=4), options=off).cycle()
    assert [len(m) for m in _messages(calls, 4)] == [4, 4, 2]
    calls.clear()
    with sqlite.session() as s:
        jobs.unmark_queued(s, ROLLOUT_WORK, jobs.queued_ids(s, ROLLOUT_WORK))
    Dispatcher(sqlite, outlets(lambda ids: calls.append(list(ids)), per_message=4)).cycle()
    assert [len(m) for m in _messages(calls, 4)] == [3, 2, 2, 1], "on: 10 left, ceil(10/4)=3, ..."
