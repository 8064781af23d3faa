"""Fixtures: a throwaway PostgreSQL database, a Redis queue, SQLite files, worker processes
(the helpers tests share are in ``tests/helpers.py``), and the test tiers.

Tests that need PostgreSQL or Redis fail (never skip) when the service does not answer:
CI must prove the real thing.  Point them elsewhere with STEPQ_TEST_PG_URL (a server URL
whose database part is ignored) and STEPQ_TEST_REDIS_URL.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from stepq.migrations import upgrade
from stepq.models import Database
from tests.helpers import PG_SERVER, REDIS_URL, TABLES, Cluster, clean_env


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for this test session, dropped afterwards."""
    admin = create_engine(PG_SERVER, isolation_level="AUTOCOMMIT", pool_pre_ping=True)  # outlives a PG restart
    name = f"stepq_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # pragma: no cover - the failure message is the point
        pytest.fail(f"PostgreSQL is required for this test and did not answer at {PG_SERVER}: {exc}")
    url = make_url(PG_SERVER).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    yield url
    with admin.connect() as conn:
        conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


@pytest.fixture
def pg(pg_url: str) -> Iterator[Database]:
    """The session's PostgreSQL database, emptied before each test."""
    db = Database(pg_url)
    with db.engine.begin() as conn:
        # Whatever an earlier test left connected (a killed worker's session) must not
        # block the truncate.
        conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
        conn.execute(text("SET LOCAL lock_timeout = '20s'"))
        conn.execute(text(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE"))
    yield db
    db.dispose()


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[Database]:
    url = f"sqlite:///{tmp_path / 'stepq.db'}"
    upgrade(url)
    db = Database(url)
    yield db
    db.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db(request: pytest.FixtureRequest) -> Database:
    """The same test on the embedded default and on PostgreSQL."""
    return request.getfixturevalue("sqlite" if request.param == "sqlite" else "pg")


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is required for this test and did not answer at {REDIS_URL}: {exc}")
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def cluster(pg_url: str, pg: Database, redis_client: redis.Redis, tmp_path: Path) -> Iterator[Cluster]:
    """Real `stepq worker` processes against the test PostgreSQL and Redis."""
    env = clean_env(
        STEPQ_DATABASE_URL=pg_url,
        STEPQ_BROKER_URL=REDIS_URL,
        STEPQ_QUEUE=f"stepq.test.{uuid.uuid4().hex[:8]}",
        STEPQ_LEASE_TTL_S="3",
        STEPQ_BATCH_ROLLOUTS="16",
        STEPQ_VISIBILITY_TIMEOUT_S="3600",
        STEPQ_LOST_GRACE_S="2",
        STEPQ_DISPATCH_INTERVAL_S="0.3",
        PYTHONUNBUFFERED="1",
    )
    c = Cluster(env, tmp_path)
    yield c
    c.stop()


# --- test tiers -------------------------------------------------------------------------
SERVICES = {"pg", "pg_url", "any_db", "redis_client", "cluster"}
"""Fixtures that need PostgreSQL or Redis: a test using one is ``integration``."""
LOCAL = {"sqlite", "tmp_path", "tmp_path_factory", "tiny_model"}
"""Fixtures of tests that write files, start ``stepq`` processes or load models: not unit."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test gets its tier: ``integration`` when it uses PostgreSQL or Redis (or says so),
    ``slow`` as marked (training runs, engines), and ``unit`` when it needs no service, no
    files, no process and no marked tier: pure functions, parsers, rules (``pytest -m unit``).
    The rest (the CLI as processes on SQLite files) runs with the whole suite."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        marks = {m.name for m in item.iter_markers()}
        if names & SERVICES and "integration" not in marks:
            item.add_marker(pytest.mark.integration)
            marks.add("integration")
        if not marks & {"integration", "slow", "vllm"} and not names & LOCAL:
            item.add_marker(pytest.mark.unit)
