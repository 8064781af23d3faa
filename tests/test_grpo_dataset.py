"""The GRPO judge's training rows are the snapshot's train split, each with its own label, and
the reward reads that label (an inverted label, or a validation row among the training rows,
fails here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepq.models import Database, queries
from stepq.trainer.generative_judge.prompt import JudgePrompt
from stepq.trainer.generative_judge.rewards import get_rewards
from stepq.trainer.methods.grpo import judge_dataset
from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
from stepq.trainer.training.recipe import Recipe
from tests.helpers import annotated_set

pytestmark = pytest.mark.slow


def test_grpo_rows_are_the_train_split_with_their_own_labels(sqlite: Database, tmp_path: Path) -> None:
    annotated_set(sqlite, problems=25, error_rate=0.25, recovery_rate=0.0)
    ref = create_snapshot(sqlite, SnapshotSpec(("s",), "abs-q", val_fraction=0.3, seed=0))
    template = tmp_path / "t.txt"
    template.write_text("{problem}|{history}|{chunk}|")
    recipe = Recipe.parse(f"model: m\njudge_template: {template}\nconversational: false\n")
    rows = list(judge_dataset(sqlite, ref, recipe))
    with sqlite.session() as s:
        truth = {r.chunk_id: (r.split, r.positive, r.chunk_idx, r.trajectory_id) for r in queries.snapshot_rows(s, ref)}
        contexts = queries.snapshot_contexts(s, ref)
    train = {c for c, (split, *_) in truth.items() if split == "train"}
    assert {r["chunk_id"] for r in rows} == train and len(rows) == len(train)
    prompt = JudgePrompt(template.read_text())
    for r in rows:
        _, positive, idx, tid = truth[r["chunk_id"]]
        assert r["label"] == ("Positive" if positive else "Negative")
        chunks = contexts[tid]["chunks"]
        assert r["prompt"] == prompt.render(contexts[tid]["question"], chunks[: idx - 1], chunks[idx - 1])
    (verdict_match,) = get_rewards(["verdict-match"])
    answers = [f"\\boxed{{{r['label']}}}" for r in rows]
    flipped = ["\\boxed{Negative}" if r["label"] == "Positive" else "\\boxed{Positive}" for r in rows]
    labels = [r["label"] for r in rows]
    assert verdict_match(answers, label=labels) == [1.0] * len(rows)
    assert verdict_match(flipped, label=labels) == [0.0] * len(rows)
