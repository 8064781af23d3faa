"""The dispatcher: turns what the database says is missing into broker messages.

The broker only carries hints (a few work item ids per message).  Each cycle the dispatcher
plans work for new trajectories or a raised budget, returns expired leases to pending,
notices queued jobs whose message was lost, and publishes what is pending.  Only one
dispatcher acts at a time (a lease in the ``locks`` table); a second one waits for it.

The broker stays bounded: the dispatcher keeps only as many items queued as the live
workers (from their heartbeats) can take soon, a few messages each, and tops the queue up
as it drains; a multi-day backlog waits in the database, not in Redis.  A queued item is
published again only when its message cannot still be in the broker: no message there
carries it (the broker's contents are read each cycle: waiting and delivered-unacknowledged
messages, so a lost message is found while the queue holds other work) and it was queued a
grace period ago.  When the contents cannot be read, only an empty queue says messages were
lost; when not even the depth can be told, a job queued ``requeue_after_s`` ago is presumed
lost.  Every kind of queue work (``stepq.workers.kinds``: rollouts, step searches, priority scorings)
shares that one bound, counted in messages; each cycle starts with the next kind.  Rollout
work is published one set at a time in turn, each set's in its priority order
(``jobs.pending_ids``), so a large or prioritised set cannot starve another.

An outage is weathered, not fatal: a running dispatcher that cannot reach the broker or the
database logs it, waits (doubling up to ``outage_backoff_max_s``) and tries again, keeping
its lock whenever the database answers; nothing it could not publish stays marked queued.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stepq.models import Database, epoch, jobs, queries
from stepq.models.errors import BrokerError, Busy, cause_of
from stepq.workers.jobqueue.broker_contents import JobsInBroker
from stepq.workers.jobqueue.job_kind import Outlet, PartlyPublished
from stepq.workers.jobqueue.message_split import SmallMessages, split_messages, tail_threshold

log = logging.getLogger("stepq.dispatcher")

LOCK_NAME = "dispatcher"


@dataclass(frozen=True)
class DispatchOptions:
    lock_ttl_s: float = 30.0
    requeue_after_s: float = 900.0
    """Only when the broker's queue depth is unknown: a queued item older than this is
    presumed lost and published again."""
    lost_grace_s: float = 10.0
    """When the broker queue is empty, queued items older than this are surely lost."""
    batch: int = 500
    messages_per_worker: int | None = 2
    """Messages kept queued per live worker; None publishes everything pending (embedded)."""
    min_messages: int = 2
    """Kept queued even with no live worker, so the first one to start finds work."""
    worker_live_s: float = 30.0
    """A worker whose heartbeat is older than this is not counted."""
    sample_every_s: float = 5.0
    """How often the dispatcher records each set's progress (rates, ETAs, history)."""
    outage_backoff_max_s: float = 30.0
    """The longest wait between tries while the broker or the database is unreachable."""
    split_tail: bool = True
    """Near the end of the backlog, publish smaller messages so every live worker finishes
    together (``message_split``); off: every message carries ``per_message`` jobs."""


def broker_bound(options: DispatchOptions, live: int) -> int | None:
    """The broker's bound with ``live`` workers: a few messages each, at least
    ``min_messages``; None when the bound is off (the embedded default publishes all)."""
    if options.messages_per_worker is None:
        return None
    return max(options.min_messages, options.messages_per_worker * live)


@dataclass(frozen=True)
class CycleReport:
    planned: int = 0
    expired: int = 0
    failed: int = 0
    requeued: int = 0
    published: int = 0
    bound: int | None = None
    live_workers: int = 0


class Dispatcher:
    """Publishes every kind of queue work (``outlets``: one per kind) within one broker bound."""

    def __init__(
        self,
        db: Database,
        outlets: Sequence[Outlet],
        *,
        options: DispatchOptions | None = None,
        queue_depth: Callable[[], int | None] | None = None,
        in_broker: Callable[[], JobsInBroker | None] | None = None,
        name: str | None = None,
        wakeup: Callable[[float], bool] | None = None,
    ) -> None:
        """``wakeup(seconds)``: wait at most that long between cycles, returning early (True)
        when work is announced (``models.wakeup.WorkListener.wait``); None: sleep."""
        self.db = db
        self.outlets = list(outlets)
        self.options = options or DispatchOptions()
        self.queue_depth = queue_depth or (lambda: None)
        self.in_broker = in_broker or (lambda: None)
        self.wakeup = wakeup
        self.name = name or f"dispatcher@{socket.gethostname()}:{os.getpid()}"
        self._sampled_at = 0.0
        self._turn = 0
        self._set_turn = 0
        self._small = SmallMessages()

    def cycle(self) -> CycleReport:
        """One pass; call only while holding the lock (``run`` does)."""
        o = self.options
        now = epoch()
        expired = failed = 0
        with self.db.session() as s:
            # each kind plans its own missing jobs (rollouts for new trajectories, then the
            # scorings that order a prioritised set's new work)
            planned = sum(outlet.kind.plan(s) for outlet in self.outlets if outlet.kind.plan is not None)
            for outlet in self.outlets:
                back, gave_up = jobs.expire_leases(s, outlet.kind.table, now, outlet.kind.retry.max_attempts)
                expired, failed = expired + back, failed + gave_up
            queries.count_event(s, "lease_expiries", expired + failed)
            queries.count_event(s, "items_failed", failed)
            if now - self._sampled_at >= o.sample_every_s:
                queries.record_progress(s, now)
                self._sampled_at = now
        requeued = self.recover_lost(now)
        live = self.live_workers()
        bound = self.bound(live)
        published = 0
        # Each cycle starts with the next kind, so one kind's backlog cannot starve another's.
        self._turn = (self._turn + 1) % max(1, len(self.outlets))
        for outlet in self.outlets[self._turn :] + self.outlets[: self._turn]:
            published += self.publish_pending(outlet, bound, live)
        report = CycleReport(planned, expired, failed, requeued, published, bound, live)
        if any((planned, expired, failed, requeued, published)):
            log.info("dispatch: %s", report)
        return report

    def publish_pending(self, outlet: Outlet, bound: int | None, live: int = 0) -> int:
        """Mark pending jobs of one kind queued and publish them, while the bound has room.

        Near the end of the backlog (fewer pending jobs than ``message_split.tail_threshold``
        for ``live`` workers) the messages get smaller, so the last ones spread over every
        worker."""
        table, per = outlet.kind.table, outlet.per_message
        batch = max(per, self.options.batch // per * per)
        tail = tail_threshold(per, live) if bound is not None and self.options.split_tail else 0
        published = 0
        while True:
            with self.db.session() as s:
                # The lock is checked (and renewed) in the transaction that marks the jobs queued:
                # a dispatcher that froze, or waited out its lease on a lock, and lost it to
                # another publishes nothing, instead of its stale batch beside the new holder's.
                holder = queries.lock_holder(s, LOCK_NAME)
                if holder is not None and holder != self.name:
                    log.warning("dispatcher lock lost to %s; publishing nothing more this cycle", holder)
                    break
                if holder == self.name:
                    queries.acquire_lock(s, LOCK_NAME, self.name, self.options.lock_ttl_s)
                room_messages = None if bound is None else bound - self.queued_messages(s)
                room = batch if room_messages is None else min(batch, room_messages * per)
                limit = max(room, tail) if room > 0 else 0
                held_back = outlet.kind.held_back
                waiting = held_back(s) if held_back is not None and limit > 0 else set()
                ids = jobs.pending_ids(s, table, limit, first_set=self._set_turn, skip_sets=waiting) if limit else []
                self._set_turn += 1
                messages = split_messages(ids, per, live if tail else 1, complete=len(ids) < limit)
                messages = messages[:room_messages] if room_messages is not None else messages
                claimed = set(jobs.mark_queued(s, table, [i for m in messages for i in m], epoch()))
            messages = [kept for m in messages if (kept := [i for i in m if i in claimed])]
            if not messages:
                break
            sent: list[int] = []
            try:
                if all(len(m) == per for m in messages[:-1]):
                    outlet.publish([i for m in messages for i in m])  # full messages (the last may be short)
                else:
                    for m in messages:
                        outlet.publish(m)
                        sent += m
            except Exception as exc:
                sent += exc.sent if isinstance(exc, PartlyPublished) else []
                with self.db.session() as s:  # what reached the broker stays queued: no message twice
                    jobs.unmark_queued(s, table, sorted(claimed - set(sent)))
                raise BrokerError(
                    f"cannot publish to the broker ({len(sent)} of {len(claimed)} jobs published): {exc}"
                ) from exc
            self._small.add(table.name, messages, per)
            published += len(claimed)
            if len(ids) < limit or sum(map(len, messages)) < len(ids):
                break
        return published

    def recover_lost(self, now: float) -> int:
        """Queued jobs whose message is gone go back to pending (and are published again).

        When the broker can say which jobs its messages carry (``in_broker``: waiting or
        delivered and unacknowledged), a job queued ``lost_grace_s`` ago that no message
        carries is lost, even while the queue holds other work.  Otherwise only the depth
        helps: see ``lost_before``."""
        seen = self.in_broker()
        before = now - self.options.lost_grace_s if seen is not None else self.lost_before(now, self.queue_depth())
        if before is None:
            return 0
        lost = 0
        with self.db.session() as s:
            for outlet in self.outlets:
                carried = seen.get(outlet.kind.task_name, set()) if seen is not None else set()
                gone = [i for i in jobs.queued_ids(s, outlet.kind.table, before) if i not in carried]
                jobs.unmark_queued(s, outlet.kind.table, gone)
                lost += len(gone)
            queries.count_event(s, "messages_lost", lost)
        return lost

    def lost_before(self, now: float, depth: int | None) -> float | None:
        """Queued before this, a message is presumed lost: a grace period when the broker says
        its queue is empty, ``requeue_after_s`` when it cannot say; None while the queue holds
        messages (any queued one may still be waiting: republishing it would break the bound
        and publish twice)."""
        o = self.options
        if depth is not None and depth > 0:
            return None
        return now - (o.lost_grace_s if depth == 0 else o.requeue_after_s)

    def queued_messages(self, session: Any) -> int:
        """Messages in the broker (waiting, or reserved by a worker that has not claimed their
        jobs yet), over every kind: the one bound counts them all."""
        total = 0
        for o in self.outlets:
            t = o.kind.table
            if self._small.tracks(t.name):  # a tail of small messages: count them as they are
                total += self._small.count(t.name, jobs.queued_ids(session, t), o.per_message)
            else:
                total += -(-jobs.queued_count(session, t) // o.per_message)
        return total

    def live_workers(self) -> int:
        """Workers whose heartbeat is recent (0 for the embedded runner: it has no bound)."""
        if self.options.messages_per_worker is None:
            return 0
        with self.db.session() as s:
            return queries.live_worker_count(s, epoch() - self.options.worker_live_s)

    def bound(self, live: int | None = None) -> int | None:
        """How many messages may be queued at once: a few per live worker."""
        return broker_bound(self.options, self.live_workers() if live is None else live)

    def pause(self, stop: threading.Event, seconds: float) -> None:
        """Wait between cycles: until ``seconds`` pass, work is announced, or ``stop`` is set
        (checked every half second while listening)."""
        if self.wakeup is None:
            stop.wait(seconds)
            return
        deadline = time.monotonic() + seconds
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            if self.wakeup(min(left, 0.5)):
                return

    def holder(self) -> str | None:
        with self.db.session() as s:
            return queries.lock_holder(s, LOCK_NAME)

    def acquire(self) -> bool:
        with self.db.session() as s:
            return queries.acquire_lock(s, LOCK_NAME, self.name, self.options.lock_ttl_s)

    def release(self) -> None:
        with self.db.session() as s:
            queries.release_lock(s, LOCK_NAME, self.name)

    def run(
        self,
        *,
        once: bool = False,
        interval_s: float = 2.0,
        wait_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> int:
        """Loop until stopped (or one cycle with ``once``); returns work items published.

        Waits for the lock while another dispatcher holds it: a standby dispatcher as long as it
        runs; with ``once``, at most ``wait_s`` (none by default), then ``Busy`` (exit 75): a
        one-shot cycle that cannot act says so rather than hang or exit 0 as if done.
        """
        stop = stop or threading.Event()
        if once and wait_s is None:
            wait_s = 0.0
        started = time.monotonic()
        published = 0
        waiting_logged = False
        outage: Outage | None = None
        try:
            while not stop.is_set():
                try:
                    if not self.acquire():
                        if not waiting_logged:
                            log.info("another dispatcher holds the lock; waiting")
                            waiting_logged = True
                        if wait_s is not None and time.monotonic() - started >= wait_s:
                            if once:
                                raise Busy(f"another dispatcher ({self.holder()}) holds the lock: nothing published")
                            return published
                        stop.wait(min(1.0, interval_s))
                        continue
                    published += self.cycle().published
                except Exception as exc:
                    what = outage_kind(exc)
                    if once or what is None:
                        raise
                    outage = outage or Outage(what, time.monotonic())
                    delay = outage.next_delay(self.options.outage_backoff_max_s)
                    first = _first_line(exc)
                    cause = cause_of(first)
                    said = f"{what} {cause}" if cause == "unreachable" else f"{what}: {cause}"
                    log.warning("%s (%s); trying again in %.0f s", said, first, delay)
                    stop.wait(delay)
                    continue
                if outage is not None:
                    log.info("%s reachable again after %.0f s", outage.what, time.monotonic() - outage.since)
                    outage = None
                if once:
                    return published
                self.pause(stop, interval_s)
        finally:
            try:
                self.release()
            except Exception as exc:  # the database is down: the lock expires by itself
                log.warning("could not release the dispatcher lock: %s", _first_line(exc))
        return published


@dataclass
class Outage:
    """An ongoing outage: what is down, since when, and the next wait (doubling)."""

    what: str
    since: float
    delay: float = 0.5

    def next_delay(self, ceiling: float) -> float:
        self.delay = min(ceiling, self.delay * 2)
        return self.delay


def outage_kind(exc: BaseException) -> str | None:
    """``broker`` or ``database`` when ``exc`` says that one cannot be reached now (worth
    waiting out), None for anything else (a bug, a bad setting: let it surface)."""
    from kombu.exceptions import OperationalError as KombuOperationalError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
    from sqlalchemy.exc import DBAPIError, OperationalError

    if isinstance(exc, (BrokerError, KombuOperationalError, RedisConnectionError, RedisTimeoutError)):
        return "broker"
    if isinstance(exc, OperationalError) or (isinstance(exc, DBAPIError) and exc.connection_invalidated):
        return "database"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
