"""Declarative base with a naming convention, so Alembic constraint names are stable."""

from __future__ import annotations

import logging
import time

from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


CLOCK_JUMP_S = 5.0
"""A change of this host's wall clock against the monotonic one larger than this is logged."""

# anchor_s: the database's epoch seconds at monotonic zero (what ``epoch`` adds to the monotonic
# clock); wall_s: this host's wall clock at monotonic zero, as last seen (a change is a jump)
_clock = {"anchor_s": time.time() - time.monotonic(), "wall_s": time.time() - time.monotonic()}
log = logging.getLogger("stepq.clock")


def epoch() -> float:
    """The database server's clock, in epoch seconds: the monotonic clock carried from the last
    reading of the server's (``set_server_time``, on every new PostgreSQL connection; this
    host's wall clock at start on SQLite).  Every lease, deadline and timestamp stepq stores or
    compares is taken from it, so a host whose clock is minutes off neither lets its own leases
    lapse at once nor holds others' past their time, and a wall clock that jumps after start
    (an NTP step, an operator's date) changes nothing: it is logged.  Floats, so both dialects
    compare them alike."""
    now = time.monotonic()
    wall = time.time() - now
    if abs(wall - _clock["wall_s"]) > CLOCK_JUMP_S:
        log.warning(
            "this host's clock jumped %+.0f s; stepq keeps the database's time (a monotonic clock between readings)",
            wall - _clock["wall_s"],
        )
        _clock["wall_s"] = wall
    return now + _clock["anchor_s"]


def set_server_time(server_epoch: float, at_monotonic: float) -> None:
    """The server's clock read ``server_epoch`` at ``at_monotonic`` on this host."""
    _clock["anchor_s"] = server_epoch - at_monotonic


def clock_offset() -> float:
    """How far the database's clock is ahead of this host's wall clock, in seconds."""
    return epoch() - time.time()
