"""The command line: the embedded default end to end, and errors as messages with exit codes."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from stepq.models import Database
from stepq.settings import Settings
from stepq.workers.data.synthetic_set import synth_set
from tests.helpers import clean_env, run_stepq


def _run(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    return run_stepq(*args, env=clean_env(**(env or {})), cwd=cwd, timeout=timeout)


def test_run_completes_from_an_empty_directory_without_services(tmp_path: Path) -> None:
    # The broker points at a closed port: the embedded default must not need it.
    env = {"STEPQ_BROKER_URL": "redis://127.0.0.1:1/0"}
    proc = _run(["run", "--synthetic", "20", "--rollouts", "4"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert "abs-q labels agree with the synthetic step-level ground truth" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("stepq.db-")) == ["stepq.db"]
    with sqlite3.connect(tmp_path / "stepq.db") as conn:
        done, planned, labelled, chunks = conn.execute(
            "SELECT rollouts_done, rollouts_planned, labelled_chunks, chunks FROM annotation_progress"
        ).fetchone()
    assert done == planned > 0 and labelled == chunks
    again = _run(["run", "--synthetic", "20", "--rollouts", "4"], tmp_path, env)
    assert again.returncode == 0 and "work items: {}" in again.stdout, "a second run has nothing to do"
    status = _run(["status", "--json"], tmp_path, env)
    row = json.loads(status.stdout)["sets"][0]
    assert row["problem_set"] == "demo" and row["rollouts_done"] == done


def test_label_recomputes_another_rule_without_sampling(tmp_path: Path) -> None:
    assert _run(["run", "--synthetic", "10", "--rollouts", "4"], tmp_path).returncode == 0
    with sqlite3.connect(tmp_path / "stepq.db") as conn:
        rollouts = conn.execute("SELECT count(*) FROM rollouts").fetchone()[0]
    proc = _run(["label", "--set", "demo", "--rule", "rel-ratio:gamma=0.7"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(tmp_path / "stepq.db") as conn:
        rules = dict(conn.execute("SELECT rule, count(*) FROM chunk_labels GROUP BY rule").fetchall())
        assert conn.execute("SELECT count(*) FROM rollouts").fetchone()[0] == rollouts
    assert set(rules) == {"abs-q", "rel-ratio:gamma=0.7"} and rules["abs-q"] == rules["rel-ratio:gamma=0.7"]


@pytest.mark.parametrize(
    ("args", "env", "code", "message"),
    [
        (["annotate", "--set", "nope", "--rollouts", "4"], {}, 4, "no problem set named 'nope'"),
        (["status"], {"STEPQ_LEASE_TTL_S": "soon"}, 2, "STEPQ_LEASE_TTL_S='soon' is not a valid float"),
        (
            ["status"],
            {"STEPQ_DATABASE_URL": "mysql://x"},
            2,
            "must be a sqlite:// or postgresql:// (or postgres://) URL",
        ),
        (["status"], {"STEPQ_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none"}, 5, "cannot reach database"),
        (["label", "--set", "demo", "--rule", "best-guess"], {}, 2, "unknown label rule 'best-guess'"),
    ],
)
def test_errors_are_messages_with_exit_codes(
    tmp_path: Path, args: list[str], env: dict[str, str], code: int, message: str
) -> None:
    Database(f"sqlite:///{tmp_path / 'stepq.db'}")
    from stepq.migrations import upgrade

    upgrade(f"sqlite:///{tmp_path / 'stepq.db'}")
    proc = _run(args, tmp_path, env)
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_unmigrated_database_says_so(tmp_path: Path) -> None:
    proc = _run(["status"], tmp_path, {"STEPQ_DATABASE_URL": f"sqlite:///{tmp_path / 'fresh.db'}"})
    assert proc.returncode == 5 and "not migrated: run 'stepq db upgrade'" in proc.stderr


def test_db_upgrade_reports_the_revision(tmp_path: Path) -> None:
    from alembic.script import ScriptDirectory

    from stepq.migrations import alembic_config

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    proc = _run(["db", "upgrade"], tmp_path)
    assert proc.returncode == 0 and f"database at revision {head}" in proc.stdout


def test_dispatch_with_the_broker_down_fails_clearly_and_keeps_work_pending(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'stepq.db'}"
    from stepq.migrations import upgrade

    upgrade(url)
    db = Database(url)
    synth_set(db, "s", problems=2)
    env = {"STEPQ_DATABASE_URL": url, "STEPQ_BROKER_URL": "redis://127.0.0.1:1/0", "STEPQ_BROKER_WAIT_S": "3"}
    assert _run(["annotate", "--set", "s", "--rollouts", "2"], tmp_path, env).returncode == 0
    proc = _run(["dispatch", "--once"], tmp_path, env, timeout=120)
    assert proc.returncode == 6, proc.stderr
    assert "broker" in proc.stderr and "Traceback" not in proc.stderr
    with sqlite3.connect(tmp_path / "stepq.db") as conn:
        assert conn.execute("SELECT state, count(*) FROM rollout_work GROUP BY state").fetchall() == [("pending", 2)]


def test_settings_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = Settings.from_env({"STEPQ_BATCH_ROLLOUTS": "64", "STEPQ_DATABASE_URL": "postgresql://u@h/db"})
    assert s.batch_rollouts == 64
    assert s.database_url == "postgresql+psycopg://u@h/db"
    assert Settings.from_env({}).database_url == f"sqlite:///{tmp_path / 'stepq.db'}"
    from stepq.models.errors import ConfigError

    with pytest.raises(ConfigError, match="VISIBILITY_TIMEOUT_S must exceed"):
        Settings.from_env({"STEPQ_VISIBILITY_TIMEOUT_S": "10", "STEPQ_LEASE_TTL_S": "60"})


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("STEPQ_LEASE_TTL_S", "nan", "STEPQ_LEASE_TTL_S='nan' is not a finite number"),
        ("STEPQ_HEARTBEAT_S", "inf", "STEPQ_HEARTBEAT_S='inf' is not a finite number"),
        ("STEPQ_RETRY_BACKOFF_S", "-1", "STEPQ_RETRY_BACKOFF_S must not be negative"),
        ("STEPQ_DISPATCH_INTERVAL_S", "-0.5", "STEPQ_DISPATCH_INTERVAL_S must not be negative"),
        ("STEPQ_GRADE_TIMEOUT_S", "-3", "STEPQ_GRADE_TIMEOUT_S must not be negative"),
        ("STEPQ_LOG_LEVEL", "LOUD", "STEPQ_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ],
)
def test_bad_settings_are_config_errors_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    """A NaN lease TTL was accepted (a killed worker's leases then never expire), negative
    intervals too, and an unknown log level ended as an internal error (exit 70)."""
    from stepq.models.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=re.escape(message)):
        Settings.from_env({variable: value})
    assert Settings.from_env({"STEPQ_LOG_LEVEL": "debug"}).log_level == "debug", "levels in any case"
    proc = _run(["status"], tmp_path, {variable: value})
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_a_sets_backend_and_sampling_come_from_annotate(tmp_path: Path) -> None:
    from stepq.workers.backends.synthetic_server import SyntheticCompletionsServer

    server = SyntheticCompletionsServer().start()
    try:
        assert _run(["synth", "--set", "remote", "--problems", "3"], tmp_path).returncode == 0
        proc = _run(
            [
                "annotate",
                "--set",
                "remote",
                "--rollouts",
                "2",
                "--backend",
                "openai",
                "--base-url",
                server.url,
                "--model",
                "synthetic",
                "--temperature",
                "0.7",
            ],
            tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        proc = _run(["run", "--set", "remote", "--rollouts", "2"], tmp_path)
        assert proc.returncode == 0, proc.stderr
    finally:
        server.stop()
    with sqlite3.connect(tmp_path / "stepq.db") as conn:
        generators = {g for (g,) in conn.execute("SELECT DISTINCT generator FROM rollouts")}
        n = conn.execute("SELECT count(*) FROM rollouts").fetchone()[0]
    assert generators == {"openai:synthetic[t=0.7,p=1,max=8192]"}
    assert n == len(server.prompts) > 0


def test_retry_brings_failed_work_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'stepq.db'}"
    from stepq.migrations import upgrade

    upgrade(url)
    synth_set(Database(url), "s", problems=2)
    env = {"STEPQ_DATABASE_URL": url}
    assert _run(["annotate", "--set", "s", "--rollouts", "2"], tmp_path, env).returncode == 0
    with sqlite3.connect(tmp_path / "stepq.db") as conn:
        conn.execute("UPDATE rollout_work SET state = 'failed', attempts = 5, last_error = 'x'")
    proc = _run(["retry", "--set", "s"], tmp_path, env)
    assert proc.returncode == 0 and "2 failed work items are pending again" in proc.stdout
    with sqlite3.connect(tmp_path / "stepq.db") as conn:
        assert (
            conn.execute("SELECT state, attempts, last_error FROM rollout_work").fetchall()
            == [("pending", 0, None)] * 2
        )
    assert _run(["retry", "--set", "nope"], tmp_path, env).returncode == 4


def test_unforeseen_errors_are_one_line_with_exit_70(tmp_path: Path) -> None:
    # a set's stored settings corrupted behind stepq's back: a failure nobody planned for
    assert _run(["synth", "--set", "m", "--problems", "2"], tmp_path).returncode == 0
    with sqlite3.connect(tmp_path / "stepq.db") as conn:
        conn.execute("UPDATE problem_sets SET sampling = 'not json'")
    proc = _run(["annotate", "--set", "m", "--rollouts", "2"], tmp_path)
    assert proc.returncode == 70, proc.stderr
    assert proc.stderr.startswith("stepq: internal error: JSONDecodeError") and "Traceback" not in proc.stderr
    debug = _run(["annotate", "--set", "m", "--rollouts", "2"], tmp_path, {"STEPQ_DEBUG": "1"})
    assert "Traceback" in debug.stderr


def _interrupted_run(tmp_path: Path, presses: int) -> tuple[subprocess.CompletedProcess[str], str]:
    """``stepq run`` mid-annotation, Ctrl-C pressed ``presses`` times (SIGINT to its whole
    process group, as a terminal sends it), 0.3 s apart, in the middle of a generate call: the
    set's synthetic policy takes 20 ms a completion (a call about 3 s), and the first press
    comes half a second after the first batch committed, while the next call runs."""
    import os
    import signal
    import sys
    import time

    from stepq.migrations import upgrade

    db = tmp_path / "stepq.db"
    upgrade(f"sqlite:///{db}")
    synth_set(Database(f"sqlite:///{db}"), "demo", problems=12, seed=0, latency_s=0.02)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepq", "run", "--rollouts", "8"],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal's foreground job
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            with sqlite3.connect(db) as conn:
                if conn.execute("SELECT count(*) FROM rollouts").fetchone()[0] > 0:
                    break
        except sqlite3.Error:
            continue
    time.sleep(0.5)
    for _ in range(presses):
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), str(db)


def _no_attempt_spent(db: str) -> None:
    with sqlite3.connect(db) as conn:
        states = dict(conn.execute("SELECT state, count(*) FROM rollout_work GROUP BY state").fetchall())
        assert set(states) <= {"done", "pending"} and states.get("pending", 0) > 0, states
        assert (
            conn.execute("SELECT count(*) FROM rollout_work WHERE state = 'pending' AND attempts > 0").fetchone()[0]
            == 0
        ), "an interrupted item spent an attempt"
        assert conn.execute("SELECT count(*) FROM rollouts WHERE grade_method = 'timeout'").fetchone()[0] == 0


@pytest.mark.parametrize("presses", [1, 2], ids=["warm", "cold"])
def test_ctrl_c_stops_a_run_and_spends_no_attempt(tmp_path: Path, presses: int) -> None:
    """The first Ctrl-C was swallowed (it killed the grading child: an answer in hand was scored
    as a timeout) and the second failed items with an attempt spent, exit 1.  Now: one press
    finishes the batch in hand and exits 130 with a one-line summary; two stop at once, 130;
    neither spends an attempt or grades anything wrong, and the next run resumes to the end."""
    proc, db = _interrupted_run(tmp_path, presses)
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-2000:])
    assert ("stopped:" if presses == 1 else "interrupted:") in proc.stderr
    assert "Traceback" not in proc.stderr
    _no_attempt_spent(db)
    again = _run(["run"], tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    with sqlite3.connect(db) as conn:
        done, planned = conn.execute("SELECT rollouts_done, rollouts_planned FROM annotation_progress").fetchone()
        assert conn.execute("SELECT count(*) FROM rollout_work WHERE state != 'done'").fetchone()[0] == 0
    assert done == planned > 0


def test_retry_counts_every_kind_of_job(tmp_path: Path) -> None:
    """Failed priority scoring jobs come back with the work items, and the command says so."""
    url = f"sqlite:///{tmp_path / 'stepq.db'}"
    from stepq.migrations import upgrade
    from stepq.workers.annotation_plans import configure_annotation

    upgrade(url)
    synth_set(Database(url), "p", problems=3)
    configure_annotation(Database(url), "p", 2, priority="random:seed=1")
    with sqlite3.connect(tmp_path / "stepq.db") as conn:
        scorings = conn.execute("UPDATE priority_scorings SET state = 'failed', attempts = 5").rowcount
    assert scorings > 0
    proc = _run(["retry"], tmp_path, {"STEPQ_DATABASE_URL": url})
    assert proc.returncode == 0 and f"{scorings} failed priority scoring jobs are pending again" in proc.stdout
    with sqlite3.connect(tmp_path / "stepq.db") as conn:
        assert conn.execute("SELECT DISTINCT state FROM priority_scorings").fetchall() == [("pending",)]


def test_a_command_starts_without_celery_or_the_training_libraries() -> None:
    """Every command parses its arguments after importing the CLI: Celery and kombu (0.15 s
    of that start-up, 2026-12-07) and torch, transformers and TRL (seconds) are imported by the
    commands that use them, when they run."""
    heavy = ("celery", "kombu", "torch", "transformers", "trl")
    code = f"import sys, stepq.cli; print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
