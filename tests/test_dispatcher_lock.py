"""One dispatcher at a time: its lock outlives any wait a cycle can do, a dispatcher that lost it
publishes nothing, and a stopped dispatcher hands it over at once."""

from __future__ import annotations

import signal
import time
from typing import Any

from sqlalchemy import event

from stepq.models import Database, queries
from stepq.settings import Settings
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.jobqueue.dispatcher import LOCK_NAME, Dispatcher
from tests.helpers import Cluster, outlets, start_dispatcher, wait_for


def test_the_lock_outlives_a_cycles_longest_lock_wait() -> None:
    """A cycle blocked on a row lock for the whole lock timeout (30 s) kept a 10 s lease: a
    second dispatcher took it and both ran a cycle."""
    default = Settings()
    assert default.dispatch_options().lock_ttl_s > 2 * default.db_lock_timeout_s
    longer = Settings(db_lock_timeout_s=120.0)
    assert longer.dispatch_options().lock_ttl_s > 2 * longer.db_lock_timeout_s


def test_a_dispatcher_that_lost_its_lock_publishes_nothing(any_db: Database) -> None:
    """It held the lock, froze past its lease, and another took it: resumed, its cycle marks
    and publishes nothing (the stale batch it would have sent is the new holder's to send)."""
    synth_set(any_db, "s", problems=6, seed=1)
    configure_annotation(any_db, "s", 2)
    sent: list[int] = []
    frozen = Dispatcher(any_db, outlets(lambda ids: sent.extend(ids)), name="frozen")
    assert frozen.acquire()
    with any_db.session() as s:  # its lease ran out while it was frozen; another holds it now
        queries.release_lock(s, LOCK_NAME, "frozen")
        assert queries.acquire_lock(s, LOCK_NAME, "standby", 60.0)
    report = frozen.cycle()
    assert report.published == 0 and sent == []
    with any_db.session() as s:
        assert queries.work_counts(s) == {"pending": 6}, "nothing marked queued either"
    standby = Dispatcher(any_db, outlets(lambda ids: sent.extend(ids)), name="standby")
    assert standby.cycle().published == len(sent) > 0, "the holder publishes (up to the broker's bound)"


def test_a_lock_released_between_a_takers_statements_is_taken(pg: Database) -> None:
    """The holder's release commits after a taker's insert met the holder's row and before
    the taker reads the row back: the taker takes the now-free lock. Under load this window
    made a second ``stepq dispatch --once`` exit with NoResultFound."""
    with pg.session() as s:
        assert queries.acquire_lock(s, LOCK_NAME, "holder", 60.0)
    releases: list[str] = []

    def release_in_between(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not releases and statement.lstrip().startswith("SELECT locks.lease_owner"):
            releases.append(statement)
            with pg.session() as other:  # another connection: commits before the read runs
                queries.release_lock(other, LOCK_NAME, "holder")

    event.listen(pg.engine, "before_cursor_execute", release_in_between)
    try:
        with pg.session() as s:
            assert queries.acquire_lock(s, LOCK_NAME, "taker", 60.0)
    finally:
        event.remove(pg.engine, "before_cursor_execute", release_in_between)
    assert releases, "the release ran between the taker's insert and its read"
    with pg.session() as s:
        assert queries.lock_holder(s, LOCK_NAME) == "taker"
        assert queries.lock_state(s, LOCK_NAME)["since"] is not None, "taking (not renewing) records when"


def test_a_sigtermed_dispatcher_releases_its_lock(cluster: Cluster, pg: Database) -> None:
    proc = start_dispatcher(cluster)

    def holder() -> str | None:
        with pg.session() as s:
            return queries.lock_holder(s, LOCK_NAME)

    wait_for(lambda: holder() is not None, 60, "the dispatcher to take its lock")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert holder() is None, "released on the way out: a standby takes over at once"
    assert time.monotonic() - started < 20
