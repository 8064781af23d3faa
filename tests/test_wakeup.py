"""Announced work wakes a waiting dispatcher at once (PostgreSQL LISTEN/NOTIFY), and a
dropped listening connection only costs the interval (``models/wakeup.py``)."""

from __future__ import annotations

import threading
import time

from sqlalchemy import text

from stepq.models import Database, queries
from stepq.models.wakeup import WorkListener, announce
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.jobqueue.dispatcher import Dispatcher, DispatchOptions
from tests.helpers import outlets, wait_for


def test_an_announcement_is_heard_only_once_its_transaction_commits(pg: Database) -> None:
    listener = WorkListener(pg.engine)
    try:
        assert listener.wait(0.2) is False, "nothing announced: the timeout passes"
        with pg.session() as s:
            announce(s)
            assert listener.wait(0.3) is False, "not before the commit"
        started = time.monotonic()
        assert listener.wait(5.0) is True
        assert time.monotonic() - started < 1.0
        with pg.session() as s:
            s.execute(text("SELECT 1"))  # a transaction that announces nothing
        assert listener.wait(0.2) is False
    finally:
        listener.close()


def _listening(pg: Database) -> int:
    with pg.engine.connect() as conn:
        query = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
        return int(conn.execute(text(query)).scalar_one())


def test_a_dropped_listening_connection_sleeps_the_interval_then_listens_again(pg: Database) -> None:
    listener = WorkListener(pg.engine)
    try:
        assert listener.wait(0.05) is False  # connected and listening
        with pg.engine.begin() as conn:  # an administrator (or a restart) drops it
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
                )
            )
        # The drop lands before the listener next waits: one noticed late (a loaded machine)
        # would sleep through the second wait instead, and miss the announcement below.
        wait_for(lambda: _listening(pg) == 0, 10, "the listening connection to be gone")
        started = time.monotonic()
        assert listener.wait(0.5) is False, "the error is a sleep, not a crash"
        assert time.monotonic() - started >= 0.45
        assert listener.wait(0.05) is False  # connects again
        with pg.session() as s:
            announce(s)
        assert listener.wait(5.0) is True
    finally:
        listener.close()


def test_annotating_a_set_wakes_a_dispatcher_waiting_a_long_interval(pg: Database) -> None:
    """A dispatcher cycling every 60 s publishes a newly annotated set's work within seconds."""
    synth_set(pg, "woken", problems=3, seed=1)
    published: list[int] = []
    listener = WorkListener(pg.engine)
    dispatcher = Dispatcher(
        pg,
        outlets(published.extend, per_message=4),
        options=DispatchOptions(messages_per_worker=None),
        wakeup=listener.wait,
    )
    stop = threading.Event()
    runner = threading.Thread(target=dispatcher.run, kwargs={"interval_s": 60.0, "stop": stop}, daemon=True)
    runner.start()
    try:
        time.sleep(1.0)  # its first cycle found nothing; it is waiting out its interval now
        assert published == []
        started = time.monotonic()
        configure_annotation(pg, "woken", 2)
        wait_for(lambda: len(published) == 3, 10, "the set's work published")
        assert time.monotonic() - started < 5.0, "at once, not after the 60 s interval"
        with pg.session() as s:
            assert queries.work_counts(s) == {"queued": 3}
    finally:
        stop.set()
        runner.join(timeout=10)
        listener.close()
    assert not runner.is_alive(), "stop is heard while listening"
