"""Declarative base with a naming convention, so Alembic constraint names are stable."""

from __future__ import annotations

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


_clock = {"offset_s": 0.0}


def epoch() -> float:
    """The database server's clock, in epoch seconds: this host's clock corrected by the
    offset last measured against the server (``set_clock_offset``, on every new PostgreSQL
    connection).  Every lease, deadline and timestamp stepq stores or compares is taken from
    it, so a host whose clock is minutes off neither lets its own leases lapse at once nor
    holds others' past their time.  Floats, so both dialects compare them alike."""
    return time.time() + _clock["offset_s"]


def set_clock_offset(seconds: float) -> None:
    _clock["offset_s"] = seconds


def clock_offset() -> float:
    return _clock["offset_s"]
