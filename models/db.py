"""Engine and session setup for PostgreSQL and the embedded SQLite default."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from stepq.models.base import clock_offset, set_server_time
from stepq.models.errors import DatabaseError, cause_of, masked, missing_on_server

log = logging.getLogger(__name__)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL lets the status command read while the embedded runner writes; the busy
    # timeout turns short lock waits into waits instead of "database is locked".
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


KEEPALIVE_PROBES = 3


@dataclass(frozen=True)
class SessionGuards:
    """Limits every PostgreSQL session of stepq's carries, so one frozen or cut-off process
    cannot stall the fleet: a process paused while its transaction was open (a frozen VM, a
    stopped container) held its row locks, and every dispatcher and worker that needed them
    waited as long as it stayed frozen (hours for a cut-off host, TCP's keepalive default).

    - ``idle_in_transaction_s``: the server ends a session idle inside a transaction this long
      (its locks go; the process, if it wakes, gets an error and its work is retried);
    - ``lock_s``: a statement waits this long for a lock, then fails (retried) instead of
      queueing behind a stuck holder;
    - ``statement_s``: no statement runs longer;
    - ``keepalive_idle_s``: TCP keepalives on both ends after this much silence (3 probes 10 s
      apart, closer when the idle time is shorter), so a host that vanished is noticed in about
      a minute; and the same bound on data sent and not acknowledged (``tcp_user_timeout``):
      keepalives are not sent while a reply is in flight, so a server that was answering when
      the host vanished otherwise waits out TCP's retransmissions (about 15 minutes) with the
      session's locks held.

    0 turns a limit off.  Every stepq transaction is short (a claim, a batch of rollouts, a
    heartbeat), far inside the defaults."""

    idle_in_transaction_s: float = 60.0
    lock_s: float = 30.0
    statement_s: float = 600.0
    keepalive_idle_s: int = 30

    def server_options(self) -> list[str]:
        def ms(seconds: float) -> int:
            return int(seconds * 1000)

        options = [
            f"-c idle_in_transaction_session_timeout={ms(self.idle_in_transaction_s)}",
            f"-c lock_timeout={ms(self.lock_s)}",
            f"-c statement_timeout={ms(self.statement_s)}",
        ]
        if self.keepalive_idle_s:
            idle, interval = self.keepalive_idle_s, self.keepalive_interval_s
            options += [f"-c tcp_keepalives_idle={idle}", f"-c tcp_keepalives_interval={interval}"]
            options += [f"-c tcp_keepalives_count={KEEPALIVE_PROBES}", f"-c tcp_user_timeout={self.user_timeout_ms}"]
        return options

    @property
    def keepalive_interval_s(self) -> int:
        return max(1, min(10, self.keepalive_idle_s))

    @property
    def user_timeout_ms(self) -> int:
        """Unacknowledged data is given up on after as long as keepalives take to give up."""
        return 1000 * (self.keepalive_idle_s + KEEPALIVE_PROBES * self.keepalive_interval_s)

    def client_args(self) -> dict[str, Any]:
        if not self.keepalive_idle_s:
            return {}
        return {
            "keepalives": 1,
            "keepalives_idle": self.keepalive_idle_s,
            "keepalives_interval": self.keepalive_interval_s,
            "keepalives_count": KEEPALIVE_PROBES,
            "tcp_user_timeout": self.user_timeout_ms,
        }


CLOCK_WARNING_S = 5.0


def _measure_clock(dbapi_conn: Any, _record: Any) -> None:
    """The server's clock against this host's, halfway through the round trip."""
    cur = dbapi_conn.cursor()
    try:
        sent = time.monotonic()
        cur.execute("SELECT extract(epoch FROM clock_timestamp())")
        server = float(cur.fetchone()[0])
        halfway = (sent + time.monotonic()) / 2
    finally:
        cur.close()
    offset = server - (time.time() - (time.monotonic() - halfway))
    if abs(offset) > CLOCK_WARNING_S and abs(offset - clock_offset()) > 1.0:
        log.warning(
            "this host's clock is %.0f s %s the database's; stepq keeps time by the database's",
            abs(offset),
            "behind" if offset > 0 else "ahead of",
        )
    set_server_time(server, halfway)


def make_engine(
    url: str, *, pool_size: int = 5, synchronous_commit: bool = True, guards: SessionGuards | None = None
) -> Engine:
    """Build an engine with the settings each dialect needs for many short transactions.

    ``synchronous_commit=False`` (PostgreSQL) lets a commit return before its WAL is on
    disk.  A server crash then loses the last fraction of a second of commits, all of
    them together and in order, so the database stays consistent and the lost work is
    simply scheduled again; a worker crash loses nothing more than before.
    """
    if url in ("sqlite://", "sqlite:///:memory:"):  # one in-memory database, whichever thread asks (tests)
        engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    guards = guards or SessionGuards()
    options = guards.server_options() + ([] if synchronous_commit else ["-c synchronous_commit=off"])
    args = {"options": " ".join(options), **guards.client_args()}
    engine = create_engine(
        url, pool_size=pool_size, pool_pre_ping=True, pool_recycle=1800, max_overflow=pool_size, connect_args=args
    )  # recycled: each new connection measures the clock again
    event.listen(engine, "connect", _measure_clock)
    return engine


class Database:
    """An engine plus a session factory; one per process, passed down explicitly."""

    def __init__(
        self, url: str, *, pool_size: int = 5, synchronous_commit: bool = True, guards: SessionGuards | None = None
    ) -> None:
        self.url = url
        self.engine = make_engine(url, pool_size=pool_size, synchronous_commit=synchronous_commit, guards=guards)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits on success and rolls back on any error."""
        with self.sessions() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def check(self) -> None:
        """Fail with a clear message when the database is unreachable or not migrated."""
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1 FROM problem_sets LIMIT 1"))
        except OperationalError as exc:
            msg = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            missing = missing_on_server(msg)  # PostgreSQL: the connection itself was refused
            if missing is not None:
                raise DatabaseError(f"{missing} (at {self.engine.url.host})") from None
            if "no such table" in msg or "does not exist" in msg:
                raise DatabaseError(f"database {self.safe_url} is not migrated: run 'stepq db upgrade'") from None
            cause = cause_of(msg)
            if cause != "unreachable":
                raise DatabaseError(f"database {self.safe_url}: {cause}: {msg}") from None
            raise DatabaseError(f"cannot reach database {self.safe_url}: {msg}") from None
        except Exception as exc:  # ProgrammingError on PG for a missing table, or a bad connection option
            if "does not exist" in str(exc):
                raise DatabaseError(f"database {self.safe_url} is not migrated: run 'stepq db upgrade'") from None
            orig = getattr(exc, "orig", None)
            if orig is not None:
                first = str(orig).strip().splitlines()[0]
                raise DatabaseError(f"cannot connect to database {self.safe_url}: {masked(first)}") from None
            raise

    @property
    def safe_url(self) -> str:
        return masked(self.engine.url.render_as_string(hide_password=True))

    def dispose(self) -> None:
        self.engine.dispose()
