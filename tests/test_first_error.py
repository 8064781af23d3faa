"""Training data as first-error judges are trained: each trajectory's chunks only while the
prefix before them is alive (``--until-first-error``), in snapshots and the stepwise export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from stepq.cli import main
from stepq.models import Database, queries
from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
from stepq.trainer.snapshots.export import snapshot_records
from stepq.trainer.snapshots.first_error import until_first_dead
from stepq.trainer.snapshots.stepwise import stepwise_records
from tests.helpers import annotated_set


def test_a_trajectory_is_kept_until_its_first_dead_prefix() -> None:
    rows = [  # (trajectory, step, q_before), shuffled: the order of steps is the function's to find
        (1, 3, 0.0),
        (2, 1, 0.5),
        (1, 1, 0.75),
        (1, 2, 0.25),
        (1, 4, 0.5),  # alive again after a dead prefix (noise or recovery): still after the first error
        (2, 2, None),  # not sampled: alive
        (2, 3, 0.0),
        (3, 1, 0.0),  # dead from the start: the problem itself is never solved
    ]
    kept = until_first_dead(rows, lambda r: r)
    assert kept == [(2, 1, 0.5), (1, 1, 0.75), (1, 2, 0.25), (2, 2, None)], "the items keep their own order"
    assert until_first_dead([], lambda r: r) == []


def test_a_snapshot_until_the_first_error_holds_exactly_the_alive_prefixes(sqlite: Database, tmp_path: Path) -> None:
    """Every kept row's prefix is alive by the database's own Q-values, and every chunk whose
    earlier prefixes are all alive is a candidate (an inverted filter keeps the dead ones);
    the manifest says which practice it follows; the stepwise export filters the same way."""
    annotated_set(sqlite, problems=60, error_rate=0.25, recovery_rate=0.0)
    full = create_snapshot(sqlite, SnapshotSpec(("s",), "abs-q", 0.2, 0, balanced=False, name="all"))
    first = create_snapshot(
        sqlite, SnapshotSpec(("s",), "abs-q", 0.2, 0, balanced=False, name="first", until_first_error=True)
    )
    with sqlite.engine.connect() as conn:
        q = {
            (int(t), int(k)): float(v)
            for t, k, v in conn.execute(text("SELECT trajectory_id, prefix_len, q FROM q_values WHERE n_samples > 0"))
        }
    chunks: dict[int, list[int]] = {}
    for split in snapshot_records(sqlite, full).values():
        for r in split:
            chunks.setdefault(r["trajectory_id"], []).append(r["chunk_index"])
    expected = set()
    for tid, indices in chunks.items():
        for idx in sorted(indices):  # chunk idx (1-based) continues prefix idx - 1
            if q[(tid, idx - 1)] <= 0:
                break
            expected.add((tid, idx))
    kept = {(r["trajectory_id"], r["chunk_index"]) for split in snapshot_records(sqlite, first).values() for r in split}
    assert kept == expected
    dropped = sum(len(v) for v in chunks.values()) - len(kept)
    assert dropped > 0 and len(kept) > 0, "the set has dead prefixes to drop and alive ones to keep"
    assert any(q[(t, i)] == 0 for t, i in kept), "the last chunk kept is the first whose prefix after is dead"
    with sqlite.session() as s:
        manifest = queries.get_snapshot(s, first).manifest
        assert manifest["until_first_error"] is True and manifest["chunks"].startswith("until the first error")
        assert manifest["labelled_chunks_kept"] == len(kept) < manifest["labelled_chunks_seen"]
        assert queries.get_snapshot(s, full).manifest["until_first_error"] is False
    exported = {
        (r["trajectory_id"], r["first_step"] + k)
        for split in stepwise_records(sqlite, full, until_first_error=True).values()
        for r in split
        for k in range(len(r["completions"]))
    }
    assert exported == expected, "the stepwise export of the full snapshot filters the same way"


def test_the_commands_take_the_option(sqlite: Database, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    annotated_set(sqlite, problems=20, error_rate=0.25, recovery_rate=0.0)
    monkeypatch.setenv("STEPQ_DATABASE_URL", sqlite.url)
    done = CliRunner().invoke(main, ["snapshot", "create", "--sets", "s", "--rule", "abs-q", "--until-first-error"])
    assert done.exit_code == 0, done.output
    shown = json.loads(CliRunner().invoke(main, ["snapshot", "show", "1"]).output)
    assert shown["until_first_error"] is True
    out = tmp_path / "sw"
    done = CliRunner().invoke(main, ["export", "stepwise", "--snapshot", "1", "--out", str(out), "--until-first-error"])
    assert done.exit_code == 0, done.output
    assert (out / "train.jsonl").is_file()
    shown = CliRunner().invoke(main, ["trainer", "serve", "--help"]).output
    assert "--until-first-error" in shown
