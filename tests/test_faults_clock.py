"""The fault matrix, a host's clock: a worker whose clock is off from the start, or steps back
while it runs, on real PostgreSQL, Redis and ``stepq worker`` processes.  Leases keep the
database's time (read on every connection, carried on a monotonic clock between readings), so
each case ends with exactly the rollouts of an uninterrupted run and no lease expired under the
worker.  The clock is a stand-in for a host's: ``time.time`` replaced in the worker process alone
(``sitecustomize``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import text

from stepq.models import Database
from tests.helpers import Cluster, all_work_done, start_dispatcher, wait_for
from tests.pipeline_checks import assert_exact

BEHIND = "_host = time.time\ntime.time = lambda: _host() - 310.0\n"
"""310 s behind from the start: the leases it wrote had expired before they were taken, it stored
nothing and items failed for good."""
STEPS_BACK = (
    "_host, _start = time.time, time.monotonic()\n"
    "time.time = lambda: _host() - (310.0 if time.monotonic() - _start > 8.0 else 0.0)\n"
)
"""Steps 310 s back 8 s after start (an NTP step, an operator's date): the offset measured when
its connections opened no longer held, its leases were written already expired (36 expiries,
4 of 60 items in 90 s); now the jump is logged and changes nothing."""


@pytest.mark.parametrize(
    ("clock", "problems", "latency", "logged"),
    [
        pytest.param(BEHIND, 30, "0.004", "clock is 310 s behind the database's", id="behind-from-the-start"),
        pytest.param(STEPS_BACK, 40, "0.01", "this host's clock jumped -310 s", id="steps-back-mid-run"),
    ],
)
def test_a_worker_whose_clock_is_off_keeps_its_leases(
    cluster: Cluster, pg: Database, tmp_path: Path, clock: str, problems: int, latency: str, logged: str
) -> None:
    site = tmp_path / "clock"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import time\n" + clock)
    path = os.pathsep.join(p for p in (str(site), cluster.env.get("PYTHONPATH", "")) if p)
    off = Cluster({**cluster.env, "PYTHONPATH": path}, cluster.logs)
    cluster.cli("synth", "--set", "ck", "--problems", str(problems), "--seed", "7", "--latency-s", latency)
    cluster.cli("annotate", "--set", "ck", "--rollouts", "8")
    try:
        off.start_worker("off")
        start_dispatcher(cluster)
        wait_for(lambda: all_work_done(pg), 240, "the worker whose clock is off to finish the set")
        assert_exact(pg, "ck", 8)
        with pg.engine.connect() as conn:
            retried = conn.execute(text("SELECT count(*) FROM rollout_work WHERE attempts > 1")).scalar_one()
            workers = {w for (w,) in conn.execute(text("SELECT DISTINCT split_part(worker, '@', 1) FROM rollouts"))}
        assert retried == 0, "no lease of the worker expired under it"
        assert workers == {"off"}
        assert logged in (cluster.logs / "off.log").read_text(errors="replace")
    finally:
        off.stop()
