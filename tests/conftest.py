"""Fixtures: a throwaway PostgreSQL database, a Redis queue, SQLite files, worker processes
(the helpers tests share are in ``tests/helpers.py``), and the test tiers.

The suite runs its own PostgreSQL and Redis servers (``tests/services.py``), started once a
session when any selected test needs them: no test touches the machine's own services, which
the fault tests would otherwise restart and flush.  STEPQ_TEST_PG_URL (a server URL whose
database part is ignored) and STEPQ_TEST_REDIS_URL point the suite at servers of your choice
instead; the suite never restarts those (the restart test skips).  Tests that need a server
fail (never skip) when it does not answer: CI must prove the real thing.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

import tests.helpers as helpers
from stepq.migrations import upgrade
from stepq.models import Database
from tests.helpers import TABLES, Cluster, clean_env
from tests.services import PrivatePostgres, PrivateRedis, ServiceError

_PRIVATE: dict[str, PrivatePostgres | PrivateRedis] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Choose the private servers' ports now, so that every module reads their URLs from
    ``tests.helpers`` when it is imported; they start after collection, if needed."""
    if "STEPQ_TEST_PG_URL" not in os.environ:
        pg = _PRIVATE["pg"] = PrivatePostgres()
        helpers.PG_SERVER = pg.url
    if "STEPQ_TEST_REDIS_URL" not in os.environ:
        server = _PRIVATE["redis"] = PrivateRedis()
        helpers.REDIS_URL = f"redis://127.0.0.1:{server.port}/9"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the private servers when a selected test is more than a unit test (``pytest -m
    unit`` starts none)."""
    if not any(item.get_closest_marker("unit") is None for item in session.items):
        return
    for server in _PRIVATE.values():
        try:
            server.start()
        except ServiceError as exc:
            helpers.SERVICE_ERRORS.append(str(exc))


def pytest_unconfigure(config: pytest.Config) -> None:
    for server in _PRIVATE.values():
        server.remove()


@pytest.fixture(scope="session")
def private_pg() -> PrivatePostgres:
    """The suite's own PostgreSQL, for tests that restart it (never a server you named)."""
    pg = _PRIVATE.get("pg")
    if not isinstance(pg, PrivatePostgres) or not pg.started:
        pytest.skip("STEPQ_TEST_PG_URL names a server the suite does not own: it is never restarted")
    return pg


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for this test session, dropped afterwards."""
    server = helpers.PG_SERVER
    if helpers.SERVICE_ERRORS:
        pytest.fail("; ".join(helpers.SERVICE_ERRORS))
    admin = create_engine(server, isolation_level="AUTOCOMMIT", pool_pre_ping=True)  # outlives a PG restart
    name = f"stepq_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # pragma: no cover - the failure message is the point
        pytest.fail(f"PostgreSQL is required for this test and did not answer at {server}: {exc}")
    url = make_url(server).set(database=name).render_as_string(hide_password=False)
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


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated to the head once a session (0.3 s of Alembic a test
    otherwise, over about 150 tests); ``tests/test_migrations.py`` tests the migrations."""
    path = tmp_path_factory.mktemp("migrated") / "stepq.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def sqlite(tmp_path: Path, migrated_sqlite: Path) -> Iterator[Database]:
    """A migrated SQLite file of this test's own: a copy of the session's migrated one,
    taken through SQLite's backup API (whole and consistent whatever its journal holds)."""
    path = tmp_path / "stepq.db"
    source, target = sqlite3.connect(migrated_sqlite), sqlite3.connect(path)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    url = f"sqlite:///{path}"
    db = Database(url)
    yield db
    db.dispose()


@pytest.fixture(scope="session")
def quick_policies(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """Where the benchmarks' ``--quick`` policy (``neural_policy.QUICK``) is kept for the
    session, built by the first test that asks (most of that test's time); the others verify it.
    The suite's workers (pytest-xdist) share one folder and build it once, under a lock: two
    benchmarks building into one cache at once would race on its files."""
    from filelock import FileLock

    from bench.experiments.neural_policy import QUICK, build

    base = tmp_path_factory.getbasetemp()
    root = (base if worker_id == "master" else base.parent) / "quick-policies"
    root.mkdir(exist_ok=True)
    with FileLock(root.with_suffix(".lock")):
        build(QUICK, root)
    return root


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db(request: pytest.FixtureRequest) -> Database:
    """The same test on the embedded default and on PostgreSQL."""
    return request.getfixturevalue("sqlite" if request.param == "sqlite" else "pg")


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(helpers.REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is required for this test and did not answer at {helpers.REDIS_URL}: {exc}")
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def cluster(pg_url: str, pg: Database, redis_client: redis.Redis, tmp_path: Path) -> Iterator[Cluster]:
    """Real `stepq worker` processes against the test PostgreSQL and Redis."""
    env = clean_env(
        STEPQ_DATABASE_URL=pg_url,
        STEPQ_BROKER_URL=helpers.REDIS_URL,
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
LOCAL = {"sqlite", "tmp_path", "tmp_path_factory", "tiny_model", "quick_policies"}
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
