"""A host cut off from the network (``tests/hosts.py``: a second host on this machine whose
packets are dropped, both ways, without a word): the sessions it leaves give up in bounded time,
and the fleet loses, doubles and stalls nothing while it is away."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from stepq.migrations import upgrade
from stepq.models import Database
from stepq.models.db import SessionGuards
from tests import hosts
from tests.helpers import Cluster, all_work_done, rollout_count, start_dispatcher, wait_for
from tests.hosts import TestHost
from tests.pipeline_checks import assert_exact
from tests.services import PrivatePostgres, PrivateRedis

pytestmark = pytest.mark.integration


@pytest.fixture
def test_host() -> Iterator[TestHost]:
    """A second host on this machine (``tests/hosts.py``); CI runs as root and must make one."""
    reason = hosts.why_not()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    host = TestHost()
    try:
        yield host.create()
    finally:
        host.remove()


def test_a_session_gives_up_on_a_silent_peer_with_data_in_flight(pg_url: str) -> None:
    """Keepalives are not sent while a reply is unacknowledged: a server answering when a host
    vanished waited out TCP's retransmissions (about 15 minutes) with that session's row locks
    held, and the fleet waited behind them.  Both ends bound unacknowledged data by the time
    keepalives take to give up (5 s idle, 3 probes 5 s apart here: 20 s)."""
    guards = SessionGuards(keepalive_idle_s=5)
    db = Database(pg_url, pool_size=1, guards=guards)
    try:
        with db.engine.connect() as conn:
            shown = {
                name: conn.execute(text(f"SHOW {name}")).scalar_one()
                for name in ("tcp_user_timeout", "tcp_keepalives_idle", "tcp_keepalives_interval")
            }
            fd = conn.connection.dbapi_connection.fileno()  # type: ignore[union-attr]
            client = socket.socket(fileno=os.dup(fd))
            try:
                client_ms = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
            finally:
                client.close()
    finally:
        db.engine.dispose()
    assert shown == {
        "tcp_user_timeout": "20000",
        "tcp_keepalives_idle": "5",
        "tcp_keepalives_interval": "5",
    }  # ms, s, s
    assert client_ms == 20_000
    assert SessionGuards().user_timeout_ms == 60_000, "the default: a vanished host noticed in about a minute"


def _far_sessions(db: Database, address: str) -> str:
    """What the cut-off host's sessions were doing, and the locks they held: the clue when
    its items were not taken in time."""
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT a.pid, a.state, a.wait_event_type, a.wait_event, now() - a.state_change AS since_change, "
                "left(a.query, 80) AS query, (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid) AS locks "
                "FROM pg_stat_activity a WHERE host(a.client_addr) = :address"
            ),
            {"address": address},
        ).all()
    return "; ".join(str(tuple(r)) for r in rows) or "none"


def test_a_host_cut_off_for_a_minute_loses_nothing_and_stalls_no_one(
    cluster: Cluster, test_host: TestHost, tmp_path: Path
) -> None:
    """One worker on a host of its own, cut off from PostgreSQL and Redis for a minute mid-run
    (every packet dropped, both ways, without a word), then healed.  While it is away the
    others take its items once their leases run out and finish the set; once back, it writes
    nothing of what it lost, and alone it does the new work a raised budget brings: nothing
    lost, doubled or stuck.  The
    servers here are the test's own, listening on the host's link too.  A cut that lands inside
    a write transaction leaves its locks with the server until it ends the session
    (``STEPQ_DB_IDLE_TRANSACTION_TIMEOUT_S``, or, with a reply in flight, the unacknowledged data's
    timeout that ``STEPQ_DB_KEEPALIVE_IDLE_S`` sets): the items are taken within the lease and
    the later of those.  Seen once at 20.6 s, past a bound that left the reply-in-flight case out."""
    server = PrivatePostgres(also_listen_on=test_host.address_here)
    broker = PrivateRedis(tmp_path, also_listen_on=test_host.address_here)
    database = f"postgresql+psycopg://postgres@127.0.0.1:{server.port}/postgres"
    db = Database(database)
    here = Cluster({}, cluster.logs)
    there = Cluster({}, cluster.logs)
    try:
        server.start()
        broker.start()
        upgrade(database)
        # The defaults scaled down with the lease (3 s here, 300 s by default): a cut can
        # freeze a write transaction whose row locks every writer of the set queues behind
        # until the server ends the session (60 s by default, inside a default lease).
        scaled = {"STEPQ_DB_IDLE_TRANSACTION_TIMEOUT_S": "5", "STEPQ_DB_KEEPALIVE_IDLE_S": "5"}
        here = Cluster(
            {**cluster.env, **scaled, "STEPQ_DATABASE_URL": database, "STEPQ_BROKER_URL": broker.url}, cluster.logs
        )
        far_env = {
            **here.env,
            "STEPQ_DATABASE_URL": database.replace("127.0.0.1", test_host.address_here),
            "STEPQ_BROKER_URL": broker.url.replace("127.0.0.1", test_host.address_here),
        }
        there = Cluster(far_env, cluster.logs, host=test_host.exec_prefix())
        here.cli("synth", "--set", "cut", "--problems", "40", "--seed", "6", "--latency-s", "0.004")
        here.cli("annotate", "--set", "cut", "--rollouts", "8")
        far = there.start_worker("far")
        nears = [here.start_worker("near1"), here.start_worker("near2")]
        start_dispatcher(here)

        def far_holds() -> int:
            with db.engine.connect() as conn:
                query = "SELECT count(*) FROM rollout_work WHERE state = 'running' AND lease_owner LIKE 'far@%'"
                return int(conn.execute(text(query)).scalar_one())

        wait_for(lambda: far_holds() > 0 and rollout_count(db) > 300, 120, "the far worker to hold work mid-run")
        test_host.cut()
        cut_at = time.monotonic()
        try:
            wait_for(lambda: far_holds() == 0, 45, "the others to take the cut-off worker's items")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its sessions: {_far_sessions(db, test_host.address_there)}") from None
        taken_after = time.monotonic() - cut_at
        wait_for(lambda: all_work_done(db), 55, "the set finished while the host is away")
        assert time.monotonic() - cut_at < 60, "finished inside the minute, without the far worker"
        time.sleep(max(0.0, 60 - (time.monotonic() - cut_at)))
        assert far.poll() is None, "the cut-off worker rode the minute out"
        test_host.heal()
        assert_exact(db, "cut", 8)
        with db.engine.connect() as conn:
            before = conn.execute(text("SELECT count(*) FROM rollouts WHERE worker LIKE 'far@%'")).scalar_one()
        for near in nears:  # the healed worker alone now: it must be back in service
            near.kill()
        # new work after the heal; TCP's retransmission backoff after a minute of silence can
        # keep its broker connection quiet for a minute more before it resumes
        here.cli("annotate", "--set", "cut", "--rollouts", "16")
        wait_for(lambda: all_work_done(db), 300, "the new work done by the healed worker")
        assert_exact(db, "cut", 16)
        with db.engine.connect() as conn:
            after = conn.execute(text("SELECT count(*) FROM rollouts WHERE worker LIKE 'far@%'")).scalar_one()
            running = conn.execute(text("SELECT count(*) FROM rollout_work WHERE state <> 'done'")).scalar_one()
        assert running == 0
        assert after > before, "the healed worker took new work"
        lease = float(cluster.env["STEPQ_LEASE_TTL_S"]) + float(cluster.env["STEPQ_LOST_GRACE_S"])
        # the server lets a cut session's locks go once it idles inside its transaction too long,
        # or, if the cut caught a reply in flight, once the unacknowledged data times out
        guards = SessionGuards(
            idle_in_transaction_s=float(scaled["STEPQ_DB_IDLE_TRANSACTION_TIMEOUT_S"]),
            keepalive_idle_s=int(scaled["STEPQ_DB_KEEPALIVE_IDLE_S"]),
        )
        released = max(guards.idle_in_transaction_s, guards.user_timeout_ms / 1000)
        bound = lease + released + 10
        assert taken_after < bound, f"its items were taken {taken_after:.1f} s after the cut (bound {bound:.0f} s)"
    finally:
        for fleet in (here, there):
            fleet.stop()
        db.dispose()
        broker.remove()
        server.remove()
