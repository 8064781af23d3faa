"""Outcome-labelled solutions for discriminative PRMs: every trajectory and kept rollout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from stepq.models import Database
from stepq.models.errors import ConfigError
from stepq.trainer.outcomes.export import continuation_steps, export_outcomes
from stepq.workers.annotate import WorkerOptions, WorkerRuntime
from stepq.workers.in_process import run_in_process
from stepq.workers.planning import configure_annotation
from stepq.workers.synthetic_set import synth_set


def test_continuation_steps() -> None:
    assert continuation_steps("Step 2: 3 + 1 = 4.\n\nStep 3: 4 * 2 = 8.") == [
        "Step 2: 3 + 1 = 4.\n\n",
        "Step 3: 4 * 2 = 8.",
    ]
    assert continuation_steps("just text") == ["just text"]
    assert continuation_steps("  ") == []


def test_every_graded_solution_is_exported_with_its_outcome(sqlite: Database, tmp_path: Path) -> None:
    import datasets

    from stepq.models import queries

    with sqlite.session() as s:
        queries.ensure_set(s, "empty")
    with pytest.raises(ConfigError, match="no graded solutions"):
        export_outcomes(sqlite, "empty", tmp_path / "none")
    synth_set(sqlite, "o", problems=5, seed=4)
    configure_annotation(sqlite, "o", 4)
    run_in_process(sqlite, WorkerRuntime(sqlite, WorkerOptions(name="t")))
    counts = export_outcomes(sqlite, "o", tmp_path / "out")
    with sqlite.engine.connect() as conn:
        n_traj, n_roll, right = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM trajectories t JOIN problems p ON p.id = t.problem_id "
                "JOIN problem_sets s ON s.id = p.problem_set_id WHERE s.name = 'o'), "
                "(SELECT count(*) FROM rollouts), (SELECT sum(reward) FROM rollouts)"
            )
        ).one()
    assert counts == {"trajectory": n_traj, "rollout": n_roll}
    rows = [json.loads(line) for line in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    from_rollouts = [r for r in rows if r["source"] == "rollout"]
    assert sum(r["outcome"] for r in from_rollouts) == right
    for r in from_rollouts:
        assert r["steps"][: r["prefix_len"]] == next(
            t["steps"][: r["prefix_len"]]
            for t in rows
            if t["source"] == "trajectory" and t["trajectory_id"] == r["trajectory_id"]
        ), "a rollout's steps start with its trajectory's prefix"
    loaded = datasets.load_dataset(str(tmp_path / "out"))["train"]
    assert loaded.num_rows == len(rows) and {"prompt", "steps", "outcome"} <= set(loaded.column_names)
