"""Two commands changing one set's settings at once: the second waits for the first and says
what it replaced, so the last writer's M never wins silently."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from stepq.models import Database, queries
from stepq.models.errors import DatabaseError, cause_of
from stepq.workers.annotation_plans import PlanReport, configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from tests.helpers import clean_env, run_stepq


def test_annotate_reports_the_settings_it_replaced(any_db: Database) -> None:
    synth_set(any_db, "s", problems=2, seed=1)
    first = configure_annotation(any_db, "s", 8)
    assert first.overridden == {}, "a set never annotated has nothing to override"
    again = configure_annotation(any_db, "s", 8)
    assert again.overridden == {}
    changed = configure_annotation(any_db, "s", 16, rule="rel-ratio:gamma=0.7")
    assert changed.overridden["rollouts_per_prefix"] == (8, 16)
    assert changed.overridden["label_rule"][0] == "abs-q"


def test_a_second_annotate_waits_for_the_first_and_reports_its_values(pg: Database) -> None:
    synth_set(pg, "s", problems=2, seed=1)
    configure_annotation(pg, "s", 8)
    reports: list[PlanReport] = []
    with pg.session() as first:  # another command's transaction, holding the set while it changes M
        queries.get_set(first, "s", for_update=True).rollouts_per_prefix = 12
        first.flush()
        second = threading.Thread(target=lambda: reports.append(configure_annotation(pg, "s", 16)))
        second.start()
        time.sleep(1.0)
        assert not reports, "the second command waits for the first's transaction"
    second.join(30)
    (report,) = reports
    assert report.overridden == {"rollouts_per_prefix": (12, 16)}, "it saw, and says, the first one's M"
    with pg.session() as s:
        assert queries.get_set(s, "s").rollouts_per_prefix == 16


def test_a_lock_wait_that_times_out_is_named_not_called_unreachable(pg: Database, pg_url: str, tmp_path: Path) -> None:
    """A command that waits past the lock timeout for a set another transaction holds says so:
    "unreachable" sent operators to the network for what was a lock, a full disk or memory."""
    synth_set(pg, "s", problems=2, seed=1)
    with pg.session() as holder:
        queries.get_set(holder, "s", for_update=True)
        env = clean_env(STEPQ_DATABASE_URL=pg_url, STEPQ_DB_LOCK_TIMEOUT_S="1")
        proc = run_stepq("annotate", "--set", "s", "--rollouts", "4", env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == DatabaseError.exit_code, proc.stderr
    assert "a lock wait timed out" in proc.stderr and "unreachable" not in proc.stderr


@pytest.mark.parametrize(
    ("message", "cause"),
    [
        ("canceling statement due to lock timeout", "a lock wait timed out"),
        ('could not extend file "base/16384/2619": No space left on device', "the server's disk is full"),
        ("OOM command not allowed when used memory > 'maxmemory'.", "the server is out of memory"),
        ("out of memory DETAIL: Failed on request of size 8192.", "the server is out of memory"),
        ("database is locked", "the SQLite file is locked"),
        ('connection to server at "db" (10.0.0.2), port 5432 failed: Connection refused', "unreachable"),
        ("Error 111 connecting to redis:6379. Connection refused.", "unreachable"),
    ],
)
def test_the_cause_of_a_database_or_broker_error_is_named(message: str, cause: str) -> None:
    assert cause_of(message).startswith(cause)
