"""Outcome-labelled solutions for discriminative PRMs: every trajectory and kept rollout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from stepq.models import Database
from stepq.models.errors import ConfigError
from stepq.trainer.outcomes.export import OutcomeFilter, continuation_steps, export_outcomes, outcome_records
from tests.helpers import annotated_set


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
    annotated_set(sqlite, "o", m=4, problems=5, seed=4, worker="t", batch_rollouts=128)
    everything = OutcomeFilter(pass_rate=None, prefix_rollouts=True)
    counts = export_outcomes(sqlite, "o", tmp_path / "out", everything)
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
    annotated_set(db, name, m=4, problems=problems, seed=7, error_rate=0.3, worker="t", batch_rollouts=128)


def test_solutions_without_a_parseable_answer_are_dropped_unless_kept_as_wrong(sqlite: Database) -> None:
    """The paper drops responses with no parseable answer; counting them wrong (stepq's old
    behaviour) is an option.  Graders write final_answer NULL for them (grade 'no-answer')."""
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
    dropped = list(outcome_records(sqlite, "u", keep=OutcomeFilter(pass_rate=None, prefix_rollouts=True)))
    kept = list(
        outcome_records(sqlite, "u", keep=OutcomeFilter(keep_unparseable=True, pass_rate=None, prefix_rollouts=True))
    )
    assert sum(r["source"] == "rollout" for r in dropped) == n_rollouts - 5
    assert sum(r["source"] == "trajectory" for r in dropped) == n_trajectories - 1
    assert all(r["trajectory_id"] != tid for r in dropped if r["source"] == "trajectory")
    assert len(kept) == n_rollouts + n_trajectories
    kept_traj = next(r for r in kept if r["source"] == "trajectory" and r["trajectory_id"] == tid)
    assert kept_traj["outcome"] is False


def _responses(db: Database) -> dict[str, list[bool]]:
    """Per problem, the grades of its responses to the question, read straight from the
    tables: its trajectories and the rollouts from prefix 0, each with a parseable answer."""
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT p.external_id, t.outcome FROM trajectories t JOIN problems p ON p.id = t.problem_id "
                "WHERE t.final_answer IS NOT NULL "
                "UNION ALL SELECT p.external_id, r.reward = 1 FROM rollouts r "
                "JOIN trajectories t ON t.id = r.trajectory_id JOIN problems p ON p.id = t.problem_id "
                "WHERE r.final_answer IS NOT NULL AND r.prefix_len = 0"
            )
        ).all()
    out: dict[str, list[bool]] = {}
    for ext, right in rows:
        out.setdefault(ext, []).append(bool(right))
    return out


def test_by_default_the_data_is_the_papers(sqlite: Database) -> None:
    """The outcome-supervised PRM paper's data: the policy's responses to the question only
    (trajectories and prefix-0 rollouts, never a rollout from a later prefix), of questions
    whose responses are right 20-80% of the time, the rate over those responses (not over every
    prefix's rollouts).  Prefix rollouts as extra solutions are an option."""
    _annotated(sqlite, "p", 16)
    responses = _responses(sqlite)
    inside = {p for p, grades in responses.items() if 0.2 <= sum(grades) / len(grades) <= 0.8}
    with sqlite.engine.connect() as conn:
        by_all_rollouts = {
            ext: right / n
            for ext, right, n in conn.execute(
                text(
                    "SELECT p.external_id, sum(r.reward), count(*) FROM rollouts r "
                    "JOIN trajectories t ON t.id = r.trajectory_id JOIN problems p ON p.id = t.problem_id "
                    "WHERE r.final_answer IS NOT NULL GROUP BY p.external_id"
                )
            )
        }
    assert inside and inside != set(responses), responses  # something to keep and to drop
    old_rule = {p for p, rate in by_all_rollouts.items() if 0.2 <= rate <= 0.8}
    assert old_rule != inside, "the two rates keep different questions here (else this proves nothing)"
    records = list(outcome_records(sqlite, "p"))
    assert {r["problem_id"] for r in records} == inside
    assert {r["source"] for r in records} == {"trajectory", "rollout"}
    assert all(r["prefix_len"] == 0 for r in records if r["source"] == "rollout"), "responses to the question only"
    assert len(records) == sum(len(responses[p]) for p in inside)
    extra = list(outcome_records(sqlite, "p", keep=OutcomeFilter(prefix_rollouts=True)))
    assert {r["problem_id"] for r in extra} == {r["problem_id"] for r in records}, "the rate is the same"
    assert any(r["prefix_len"] > 0 for r in extra if r["source"] == "rollout") and len(extra) > len(records)


def test_pass_rate_bounds_are_read_and_checked() -> None:
    assert OutcomeFilter().pass_rate == (0.2, 0.8)
    assert OutcomeFilter.parse_pass_rate(None) == (0.2, 0.8)
    assert OutcomeFilter.parse_pass_rate("off") is None
    assert OutcomeFilter.parse_pass_rate("0.1:0.9") == (0.1, 0.9)
    assert OutcomeFilter().describe() == ""
    assert OutcomeFilter(pass_rate=None, prefix_rollouts=True).describe() == ":pass_rate=off:prefix-rollouts"
    with pytest.raises(ConfigError, match="LOW:HIGH"):
        OutcomeFilter.parse_pass_rate("0.2-0.8")
    with pytest.raises(ConfigError, match="0 <= low <= high <= 1"):
        OutcomeFilter(pass_rate=(0.8, 0.2))
