"""Grading methods are recorded per rollout, and ``stepq regrade`` repairs answers whose
grading timed out: rewards, Q-values and labels end as if they had been graded right."""

from __future__ import annotations

import subprocess
from pathlib import Path

from sqlalchemy import text

from stepq.models import Database
from stepq.workers.grading.grader import Grader
from stepq.workers.labelling.labels import parse_rule
from stepq.workers.labelling.qvalues import relabel_set
from stepq.workers.labelling.regrade import regrade_set
from tests.helpers import annotated_set, clean_env, run_stepq


def _state(db: Database) -> tuple[dict[int, int], dict[tuple[int, int], float], dict[int, bool]]:
    with db.engine.connect() as conn:
        rewards = dict(conn.execute(text("SELECT id, reward FROM rollouts")).all())
        q = {(t, k): v for t, k, v in conn.execute(text("SELECT trajectory_id, prefix_len, q FROM q_values"))}
        labels = dict(conn.execute(text("SELECT chunk_id, positive FROM chunk_labels")).all())
    return rewards, q, {k: bool(v) for k, v in labels.items()}


def _annotated(db: Database) -> None:
    annotated_set(db, "g", m=4, problems=10, seed=6, worker="t", batch_rollouts=128)


def test_every_rollout_records_how_it_was_graded(any_db: Database) -> None:
    _annotated(any_db)
    with any_db.engine.connect() as conn:
        methods = dict(conn.execute(text("SELECT grade_method, count(*) FROM rollouts GROUP BY grade_method")).all())
    assert None not in methods and set(methods) <= {"exact", "numeric", "verify", "no-answer"}, methods
    assert methods.get("exact", 0) > 0


def test_regrade_repairs_timed_out_grades_and_their_labels(any_db: Database) -> None:
    _annotated(any_db)
    truth = _state(any_db)
    # Grading "timed out" on 12 right answers: stored as wrong, and the labels followed.
    with any_db.engine.begin() as conn:
        ids = [i for (i,) in conn.execute(text("SELECT id FROM rollouts WHERE reward = 1 ORDER BY id LIMIT 12"))]
        conn.execute(
            text(f"UPDATE rollouts SET reward = 0, grade_method = 'timeout' WHERE id IN ({','.join(map(str, ids))})")
        )
    relabel_set(any_db, "g", parse_rule("abs-q"))
    broken = _state(any_db)
    assert broken[1] != truth[1], "the bad grades changed Q-values"

    grader = Grader()
    try:
        report = regrade_set(any_db, "g", grader, only="timeouts")
    finally:
        grader.close()
    assert report.examined == 12 and report.changed == 12 and report.unavailable == 0
    assert "timeout" not in report.methods
    assert _state(any_db) == truth, "rewards, Q-values and labels are those of a right grading"
    with any_db.engine.connect() as conn:
        reopened = conn.execute(text("SELECT count(*) FROM rollout_work WHERE state = 'pending'")).scalar_one()
    assert reopened == report.trajectories > 0, "their work reopened, so an adaptive budget can react"


def test_regrade_command_from_stored_answers_only(tmp_path: Path) -> None:
    """With texts not kept, the final answer is what is re-graded; the CLI reports it."""
    env = clean_env(STEPQ_DATABASE_URL=f"sqlite:///{tmp_path / 's.db'}", STEPQ_STORE_ROLLOUT_TEXT="false")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_stepq(*args, env=env, cwd=tmp_path)

    assert cli("run", "--set", "r", "--synthetic", "6", "--rollouts", "2").returncode == 0
    db = Database(env["STEPQ_DATABASE_URL"])
    with db.engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM rollouts WHERE text != ''")).scalar_one() == 0
        conn.execute(
            text(
                "UPDATE rollouts SET reward = 0, grade_method = 'timeout' WHERE id IN "
                "(SELECT id FROM rollouts WHERE reward = 1 ORDER BY id LIMIT 5)"
            )
        )
    db.dispose()
    out = cli("regrade", "--set", "r")
    assert out.returncode == 0, out.stderr
    assert "5 rollouts re-graded" in out.stdout and "5 rewards changed" in out.stdout, out.stdout
    assert cli("regrade", "--set", "nope").returncode == 4
