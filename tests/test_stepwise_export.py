"""``stepq export stepwise``: a snapshot in the prompt/completions/labels layout, every label
the snapshot's own, every record's steps following what its prompt shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepq.models import Database
from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
from stepq.trainer.snapshots.export import snapshot_records
from stepq.trainer.snapshots.stepwise import export_stepwise, runs, stepwise_records
from tests.helpers import annotated_set


def test_runs_of_consecutive_indices() -> None:
    assert runs([]) == []
    assert runs([1, 2, 3]) == [[1, 2, 3]]
    assert runs([1, 3, 4, 7]) == [[1], [3, 4], [7]]


@pytest.mark.parametrize("balance", [True, False])
def test_stepwise_records_hold_exactly_the_snapshots_labels(sqlite: Database, tmp_path: Path, balance: bool) -> None:
    import datasets

    annotated_set(sqlite, problems=12, error_rate=0.25, recovery_rate=0.0)
    ref = create_snapshot(sqlite, SnapshotSpec(("s",), "abs-q", val_fraction=0.25, seed=0, balanced=balance))
    rows = snapshot_records(sqlite, ref)
    records = stepwise_records(sqlite, ref)
    for split in rows:
        truth = {(r["trajectory_id"], r["chunk_index"]): (r["chunk"], r["label"] == "Positive") for r in rows[split]}
        seen = {}
        for rec in records[split]:
            assert len(rec["completions"]) == len(rec["labels"]) >= 1
            for k, (chunk, label) in enumerate(zip(rec["completions"], rec["labels"], strict=True)):
                seen[(rec["trajectory_id"], rec["first_step"] + k)] = (chunk, label)
            # the prompt is the problem and exactly the steps before the first labelled one
            assert rec["prompt"].count("Step ") == rec["first_step"] - 1
        assert seen == truth, "every snapshot row once, with its own label; nothing else"
        if not balance:
            assert all(r["first_step"] == 1 for r in records[split]), "an unbalanced snapshot: whole trajectories"
    counts = export_stepwise(sqlite, ref, tmp_path / "sw")
    loaded = datasets.load_dataset(str(tmp_path / "sw"))
    assert {s: loaded[s].num_rows for s in loaded} == counts
    assert {"prompt", "completions", "labels"} <= set(loaded["train"].column_names)
