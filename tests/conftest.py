"""Fixtures: a throwaway PostgreSQL database, a Redis queue, SQLite files, worker processes.

Tests that need PostgreSQL or Redis fail (never skip) when the service does not answer:
CI must prove the real thing.  Point them elsewhere with STEPQ_TEST_PG_URL (a server URL
whose database part is ignored) and STEPQ_TEST_REDIS_URL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from stepq.migrations import upgrade
from stepq.models import Database

PG_SERVER = os.environ.get("STEPQ_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("STEPQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")
ROOT = Path(__file__).resolve().parent.parent
# Small slices of public data sets shipped with the tests (provenance in tests/data/README.md):
# the suite passes from a clone alone, without the full sets.
DATA = ROOT / "tests" / "data"
TABLES = [
    "training_metrics",
    "training_runs",
    "snapshot_texts",
    "snapshot_rows",
    "snapshots",
    "chunk_labels",
    "q_values",
    "rollouts",
    "rollout_work",
    "chunks",
    "trajectories",
    "problems",
    "problem_sets",
    "workers",
    "locks",
    "set_counters",
    "label_counters",
    "progress_samples",
]


def clean_env(**settings: str) -> dict[str, str]:
    """What a ``stepq`` process started by a test sees: this environment without the STEPQ_
    settings of the shell that runs the tests, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    env.update(settings)
    return env


def run_stepq(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m stepq ARGS`` as a real process, its output captured (``env``: a ``clean_env``)."""
    return subprocess.run(
        [sys.executable, "-m", "stepq", *args],
        env=env if env is not None else clean_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for this test session, dropped afterwards."""
    admin = create_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
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


@dataclass
class Cluster:
    """Environment and processes of one queue deployment under test."""

    env: dict[str, str]
    logs: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start_worker(self, name: str, *extra: str, python: str = sys.executable) -> subprocess.Popen[bytes]:
        log = self.logs / f"{name}.log"
        handle = log.open("wb")
        proc = subprocess.Popen(
            [python, "-m", "stepq", "worker", "--name", name, "--loglevel", "INFO", *extra],
            env=self.env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=self.logs,
        )
        self.procs.append(proc)
        deadline = time.monotonic() + 300  # a worker with an engine loads it first
        while time.monotonic() < deadline:
            if "ready" in log.read_text(errors="replace"):
                return proc
            if proc.poll() is not None:
                raise AssertionError(f"worker {name} exited: {log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"worker {name} not ready: {log.read_text(errors='replace')[-3000:]}")

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = run_stepq(*args, env=self.env, cwd=self.logs)
        if check and result.returncode != 0:
            raise AssertionError(f"stepq {' '.join(args)} failed: {result.stdout}\n{result.stderr}")
        return result

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)


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


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def table_counts(db: Database) -> dict[str, int]:
    with db.engine.connect() as conn:
        return {t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in TABLES}
