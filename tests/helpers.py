"""Helpers the tests share (the fixtures are in ``conftest.py``): the repository's paths, a
clean environment for ``stepq`` processes, a queue deployment's processes, polling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text

from stepq.models import Database
from stepq.models.base import Base

PG_SERVER = os.environ.get("STEPQ_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("STEPQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")
"""Where the tests find PostgreSQL and Redis: ``conftest.pytest_configure`` points both at the
suite's private servers (``tests/services.py``) unless the variables name others."""
SERVICE_ERRORS: list[str] = []
"""Why a private server could not start (a test that needs it fails with this)."""
ROOT = Path(__file__).resolve().parent.parent
# Small slices of public data sets shipped with the tests (provenance in tests/data/README.md):
# the suite passes from a clone alone, without the full sets.
DATA = ROOT / "tests" / "data"
TABLES = [t.name for t in reversed(Base.metadata.sorted_tables)]
"""Every table of stepq's, children before parents (what a test database is emptied of)."""


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


@dataclass
class Cluster:
    """Environment and processes of one queue deployment under test."""

    env: dict[str, str]
    logs: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    host: list[str] = field(default_factory=list)
    """What runs its workers on another host (``tests/hosts.TestHost.exec_prefix``); here when empty."""

    def start_worker(self, name: str, *extra: str, python: str = sys.executable) -> subprocess.Popen[bytes]:
        log = self.logs / f"{name}.log"
        handle = log.open("wb")
        proc = subprocess.Popen(
            [*self.host, python, "-m", "stepq", "worker", "--name", name, "--loglevel", "INFO", *extra],
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


def outlets(
    rollouts: Callable[..., None],
    searches: Callable[..., None] | None = None,
    per_message: int = 1,
    retry: Any = None,
    scorings: Callable[..., None] | None = None,
) -> list:
    """A dispatcher's outlets publishing into test callables: rollout work ``per_message`` ids
    to a message, and (when given) step searches and priority scorings (whose kind plans the
    scoring of a prioritised set's new work); ``retry``: the kinds' retry policy."""
    from stepq.workers.jobqueue.job_kind import Outlet, with_retry
    from stepq.workers.kinds import ROLLOUTS, SCORINGS, SEARCHES

    kinds = (ROLLOUTS, SEARCHES, SCORINGS)
    rollout_kind, search_kind, scoring_kind = with_retry(kinds, retry) if retry is not None else kinds
    out = [Outlet(rollout_kind, rollouts, per_message)]
    if searches is not None:
        out.append(Outlet(search_kind, searches, 1))
    if scorings is not None:
        out.append(Outlet(scoring_kind, scorings, 1))
    return out


def freeze_holding_a_lease(pg: Database, proc: subprocess.Popen[bytes], owner: str) -> None:
    """Freeze the worker, then look: a frozen process cannot change what it holds."""

    def holding() -> bool:
        proc.send_signal(signal.SIGSTOP)
        with pg.engine.connect() as conn:
            held = conn.execute(
                text("SELECT count(*) FROM rollout_work WHERE state = 'running' AND lease_owner LIKE :o"),
                {"o": f"{owner}@%"},
            ).scalar_one()
        if not held:
            proc.send_signal(signal.SIGCONT)
        return bool(held)

    wait_for(holding, 60, f"{owner} to hold a lease", interval=0.05)


def start_dispatcher(cluster: Cluster, name: str = "dispatcher") -> subprocess.Popen[bytes]:
    """A ``stepq dispatch`` process of the cluster, logging to ``NAME.log``."""
    log = (cluster.logs / f"{name}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepq", "dispatch"],
        env=cluster.env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=cluster.logs,
    )
    cluster.procs.append(proc)
    return proc


def rollout_count(db: Database) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM rollouts")).scalar_one())


def all_work_done(db: Database) -> bool:
    from stepq.models import queries

    with db.session() as s:
        counts = queries.work_counts(s)
    return bool(counts) and set(counts) == {"done"}


def annotated_set(
    db: Database,
    name: str = "s",
    *,
    m: int = 8,
    problems: int = 40,
    seed: int = 1,
    budget: str | None = None,
    worker: str = "test",
    batch_rollouts: int = 64,
    **synth: Any,
) -> None:
    """A synthetic set (``synth``: ``synth_set``'s options) annotated to the end in process at
    ``m`` rollouts per prefix: the sequence most tests start from, written once."""
    from stepq.embedded import annotate_in_process
    from stepq.workers.data.synthetic_set import synth_set

    synth_set(db, name, problems=problems, seed=seed, **synth)
    annotate_in_process(
        db, name, m, worker=worker, batch_rollouts=batch_rollouts, **({"budget": budget} if budget else {})
    )
