"""Waking the dispatcher when work appears, instead of at its next cycle.

Work a person adds (``stepq annotate``, new trajectories, a step search, a retry, a resumed
set, a priority round) is announced with PostgreSQL's ``NOTIFY``, delivered when its
transaction commits; a dispatcher waiting between cycles ``LISTEN``s and starts a cycle at
once.  It is only a hint, like a broker message: a lost notification (the listening
connection dropped, SQLite, a dispatcher started later) costs at most one cycle's interval,
because every cycle reads what is pending from the tables anyway.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

log = logging.getLogger("stepq.dispatcher")

CHANNEL = "stepq_work"


def announce(session: Session) -> None:
    """Work is pending now: wake a waiting dispatcher when this transaction commits
    (PostgreSQL; elsewhere nothing: the next cycle finds the work)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_notify(CHANNEL, "")))


class WorkListener:
    """A connection of its own that listens for announcements (PostgreSQL only).  Any error
    drops it and waits out the timeout as a plain sleep; the next wait connects again."""

    def __init__(self, engine: Engine, connect_timeout_s: int = 5) -> None:
        if engine.dialect.name != "postgresql":
            raise ValueError("announcements need PostgreSQL")
        url = engine.url.set(drivername="postgresql")
        self._conninfo = url.render_as_string(hide_password=False)
        self._timeout = connect_timeout_s
        self._conn: Any = None

    def wait(self, timeout_s: float) -> bool:
        """Block until work is announced (True) or ``timeout_s`` passes (False)."""
        import time

        import psycopg

        started = time.monotonic()
        try:
            if self._conn is None:
                self._conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=self._timeout)
                self._conn.execute(f"LISTEN {CHANNEL}")
            for _ in self._conn.notifies(timeout=timeout_s, stop_after=1):
                return True
            return False
        except psycopg.Error as exc:
            log.debug("not listening for announcements (%s); sleeping instead", exc)
            self.close()
            time.sleep(max(0.0, timeout_s - (time.monotonic() - started)))
            return False

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken
                conn.close()
