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
from stepq.workers.annotation_config import configure_annotation
from stepq.workers.brokerless import run_in_process
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


def _annotated(db: Database, name: str, problems: int) -> None:
    synth_set(db, name, problems=problems, seed=7, error_rate=0.3)
    configure_annotation(db, name, 4)
    run_in_process(db, WorkerRuntime(db, WorkerOptions(name="t")))


def test_solutions_without_a_parseable_answer_are_dropped_unless_kept_as_wrong(sqlite: Database) -> None:
    """The paper drops responses with no parseable answer; counting them wrong (stepq's old
    behaviour) is an option.  Graders write final_answer NULL for them (grade 'no-answer')."""
    from stepq.trainer.outcomes.export import OutcomeFilter, outcome_records

    _annotated(sqlite, "u", 4)
    with sqlite.engine.begin() as conn:
        unparseable = [r[0] for r in conn.execute(text("SELECT id FROM rollouts WHERE reward = 1 ORDER BY id LIMIT 5"))]
        for rid in unparseable:
            conn.execute(
                text("UPDATE rollouts SET final_answer = NULL, reward = 0, grade_method = 'no-answer' WHERE id = :i"),
                {"i": rid},
            )
        tid = conn.execute(text("SELECT min(id) FROM trajectories")).scalar_one()
        conn.execute(text("UPDATE trajectories SET final_answer = NULL, outcome = NULL WHERE id = :t"), {"t": tid})
        n_rollouts = conn.execute(text("SELECT count(*) FROM rollouts")).scalar_one()
        n_trajectories = conn.execute(text("SELECT count(*) FROM trajectories")).scalar_one()
    assert len(unparseable) == 5
    dropped = list(outcome_records(sqlite, "u"))
    kept = list(outcome_records(sqlite, "u", keep=OutcomeFilter(keep_unparseable=True)))
    assert sum(r["source"] == "rollout" for r in dropped) == n_rollouts - 5
    assert sum(r["source"] == "trajectory" for r in dropped) == n_trajectories - 1
    assert all(r["trajectory_id"] != tid for r in dropped if r["source"] == "trajectory")
    assert len(kept) == n_rollouts + n_trajectories
    kept_traj = next(r for r in kept if r["source"] == "trajectory" and r["trajectory_id"] == tid)
    assert kept_traj["outcome"] is False


def test_pass_rate_filter_keeps_exactly_the_problems_within_the_bounds(sqlite: Database, tmp_path: Path) -> None:
    from stepq.trainer.outcomes.export import OutcomeFilter, outcome_records

    _annotated(sqlite, "p", 12)
    with sqlite.engine.connect() as conn:
        rates = {
            ext: right / n
            for ext, right, n in conn.execute(
                text(
                    "SELECT p.external_id, sum(r.reward), count(*) FROM rollouts r "
                    "JOIN trajectories t ON t.id = r.trajectory_id JOIN problems p ON p.id = t.problem_id "
                    "WHERE r.final_answer IS NOT NULL GROUP BY p.external_id"
                )
            )
        }
    inside = {p for p, rate in rates.items() if 0.2 <= rate <= 0.8}
    assert inside and inside != set(rates), rates  # the filter has something to keep and to drop
    records = list(outcome_records(sqlite, "p", keep=OutcomeFilter(pass_rate=(0.2, 0.8))))
    assert {r["problem_id"] for r in records} == inside
    assert len({r["problem_id"] for r in outcome_records(sqlite, "p")}) == len(rates)
    with pytest.raises(ConfigError, match="LOW:HIGH"):
        OutcomeFilter.parse_pass_rate("0.2-0.8")
    with pytest.raises(ConfigError, match="0 <= low <= high <= 1"):
        OutcomeFilter(pass_rate=(0.8, 0.2))
