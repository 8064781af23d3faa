"""Step preference pairs derived from stored Q-values (issue #9, the judge-free part)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from stepq.models import Database
from stepq.models.errors import ConfigError
from stepq.trainer.preferences.export import export_preferences, preference_records
from stepq.trainer.preferences.pairs import ScoredTrajectory, prompt_of, q_pairs
from tests.helpers import annotated_set, clean_env, run_stepq


def _t(
    tid: int, chunks: tuple[str, ...], q: tuple[float | None, ...], problem: str = "p", prompt: str = "Solve: Q?\n"
) -> ScoredTrajectory:
    return ScoredTrajectory(tid, problem, "Q?", chunks, q, prompt)


def test_siblings_of_a_shared_prefix_make_a_pair_past_the_margin() -> None:
    a = _t(1, ("s1", "a2", "a3"), (0.5, 0.9, 0.8, 1.0))
    b = _t(2, ("s1", "b2", "b3"), (0.5, 0.9, 0.1, 0.0))
    c = _t(3, ("c1", "c2"), (0.5, 0.2, 0.0))
    pairs = q_pairs([c, b, a], margin=0.3)
    by_prefix = {p.prefix: p for p in pairs}
    first = by_prefix[()]
    assert (first.chosen, first.rejected, first.q_chosen, first.q_rejected) == ("s1", "c1", 0.9, 0.2)
    second = by_prefix[("s1",)]
    assert (second.chosen, second.rejected) == ("a2", "b2") and second.q_chosen - second.q_rejected >= 0.3
    assert (second.chosen_trajectory, second.rejected_trajectory) == (1, 2)
    assert len(pairs) == 2, "the third step has no sibling with the same prefix"
    assert second.policy_prompt == "Solve: Q?\n"
    assert prompt_of(second.policy_prompt, second.prefix) == "Solve: Q?\ns1", "the policy's context, byte for byte"


def test_margin_ties_unsampled_and_other_problems() -> None:
    a = _t(1, ("x",), (0.5, 0.6))
    b = _t(2, ("y",), (0.5, 0.4))
    assert q_pairs([a, b], margin=0.3) == [], "a gap of 0.2 is under the margin"
    assert len(q_pairs([a, b], margin=0.2)) == 1
    unsampled = _t(3, ("z",), (0.5, None))
    assert q_pairs([a, unsampled], margin=0.01) == [], "a step without a Q-value is left out"
    other = _t(4, ("y",), (0.5, 0.0), problem="q")
    assert q_pairs([a, other], margin=0.1) == [], "steps of different problems never pair"
    same = _t(5, ("x",), (0.5, 0.1))
    assert q_pairs([a, same], margin=0.1) == [], "an identical next step is one candidate"
    other_prompt = _t(6, ("y",), (0.5, 0.0), prompt="Another template: Q?\n")
    assert q_pairs([a, other_prompt], margin=0.1) == [], "steps sampled from different prompts never pair"


def test_export_preferences_loads_with_datasets(sqlite: Database, tmp_path: Path) -> None:
    import datasets

    annotated_set(
        sqlite,
        "pref",
        m=8,
        problems=12,
        seed=2,
        trajectories_per_problem=4,
        error_rate=0.2,
        worker="t",
        batch_rollouts=128,
    )
    n = export_preferences(sqlite, "pref", tmp_path / "out", margin=0.3)
    records = preference_records(sqlite, "pref", 0.3)
    assert n == len(records) > 0
    loaded = datasets.load_dataset(str(tmp_path / "out"))["train"]
    assert loaded.num_rows == n and {"prompt", "chosen", "rejected"} <= set(loaded.column_names)
    for r in loaded:
        assert r["q_chosen"] - r["q_rejected"] >= 0.3 - 1e-9 and r["chosen"] != r["rejected"]
        assert r["prompt"].startswith("Solve the problem") and r["prompt"].count("Step ") == r["prefix_len"] + 1
        with sqlite.engine.connect() as conn:
            policy_prompt = conn.execute(
                text("SELECT prompt FROM trajectories WHERE id = :t"), {"t": r["chosen_trajectory"]}
            ).scalar_one()
            chunks = conn.execute(
                text("SELECT text FROM chunks WHERE trajectory_id = :t ORDER BY idx"), {"t": r["rejected_trajectory"]}
            ).scalars()
            rejected_prefix = "".join(list(chunks)[: r["prefix_len"]])
        assert r["prompt"] == policy_prompt + rejected_prefix, "both steps were sampled after exactly this text"
    annotated_set(
        sqlite, "single", m=2, problems=3, seed=3, worker="t", batch_rollouts=128
    )  # one solution per problem: no siblings
    with pytest.raises(ConfigError, match="no step pairs"):
        export_preferences(sqlite, "single", tmp_path / "none", margin=0.3)


def test_exported_pairs_point_from_the_higher_q_step_to_the_lower(sqlite: Database, tmp_path: Path) -> None:
    """The export's direction against Q-values computed here from the rollouts table (not
    from the export's own q fields, which a swap of chosen and rejected would carry along):
    every chosen step's mean reward exceeds its rejected sibling's by the margin, and over
    the synthetic truth chosen steps are right more often than rejected ones."""
    import json

    from stepq.workers.backends.synthetic_policy import step_is_right

    annotated_set(
        sqlite,
        "dir",
        m=8,
        problems=12,
        seed=4,
        trajectories_per_problem=4,
        error_rate=0.2,
        worker="t",
        batch_rollouts=128,
    )
    export_preferences(sqlite, "dir", tmp_path / "out", margin=0.3)
    records = [json.loads(line) for line in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    assert records
    with sqlite.engine.connect() as conn:
        q = {
            (int(t), int(k)): float(mean)
            for t, k, mean in conn.execute(
                text("SELECT trajectory_id, prefix_len, avg(reward) FROM rollouts GROUP BY trajectory_id, prefix_len")
            )
        }
        rows = conn.execute(
            text(
                "SELECT t.id, t.prompt, t.outcome, p.question, c.idx, c.text FROM trajectories t "
                "JOIN problems p ON p.id = t.problem_id JOIN chunks c ON c.trajectory_id = t.id ORDER BY t.id, c.idx"
            )
        ).all()
    chunks: dict[int, list[str]] = {}
    meta: dict[int, tuple[str, bool, str]] = {}
    for tid, prompt, outcome, question, _, body in rows:
        chunks.setdefault(tid, []).append(body)
        meta[tid] = (prompt, bool(outcome), question)

    def q_after(step: str, context: str) -> float:
        """Q after ``step`` taken right after ``context``, from any trajectory that did so."""
        for tid, own in chunks.items():
            prompt, outcome, _ = meta[tid]
            for k, body in enumerate(own):
                if body == step and prompt + "".join(own[:k]) == context:
                    return float(outcome) if k + 1 == len(own) else q[(tid, k + 1)]
        raise AssertionError(f"no trajectory took {step!r} after that context")

    right = {"chosen": 0, "rejected": 0}
    for r in records:
        assert q_after(r["chosen"], r["prompt"]) - q_after(r["rejected"], r["prompt"]) >= 0.3 - 1e-9
        question = next(m[2] for m in meta.values() if r["prompt"].startswith(m[0]))
        history = [r["prompt"].split("Solution:\n", 1)[1]] if "Solution:\n" in r["prompt"] else []
        for side in right:
            right[side] += step_is_right(question, history, r[side]) is True
    assert right["chosen"] > right["rejected"]


def test_export_preferences_command(tmp_path: Path) -> None:
    import subprocess

    env = clean_env(STEPQ_DATABASE_URL=f"sqlite:///{tmp_path / 's.db'}")

    def stepq(*args: str) -> subprocess.CompletedProcess[str]:
        return run_stepq(*args, env=env, cwd=tmp_path)

    assert stepq("synth", "--set", "p", "--problems", "6", "--trajectories-per-problem", "3").returncode == 0
    assert stepq("run", "--set", "p", "--rollouts", "4").returncode == 0
    done = stepq("export", "preferences", "--set", "p", "--out", str(tmp_path / "pairs"), "--margin", "0.25")
    assert done.returncode == 0, done.stderr
    assert "step preference pairs written" in done.stdout and (tmp_path / "pairs" / "train.jsonl").exists()
    assert stepq("export", "preferences", "--set", "nope", "--out", str(tmp_path / "x")).returncode == 4
