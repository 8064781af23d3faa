"""Helpers shared by the benchmarks: throwaway databases and JSON output."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from stepq.migrations import upgrade

PG_SERVER = os.environ.get("STEPQ_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("STEPQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/8")


@contextmanager
def scratch_pg() -> Iterator[str]:
    """A migrated PostgreSQL database that is dropped afterwards."""
    admin = create_engine(PG_SERVER, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    name = f"stepq_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_SERVER).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


def emit(result: dict[str, Any]) -> None:
    """Benchmarks print their figures as one JSON object on the last line."""
    print(json.dumps(result, sort_keys=True))


def saved_result(path: Path) -> dict[str, Any]:
    """What ``emit`` printed, read back for ``--from-json``: a run's log (its last line) or the
    object saved as a file of its own (the docs' indented JSON)."""
    text = path.read_text().strip()
    try:
        saved: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError:
        saved = json.loads(text.splitlines()[-1])
    return saved
