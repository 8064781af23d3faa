"""judge_grpo_gpu's cut of a kept seed: what travels to a lent GPU must train and score the same
snapshot, and leave the annotation behind (the lease carries 64 MiB)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from bench.experiments.judge_format import JUDGE_TEMPLATE
from bench.experiments.judge_grpo_gpu import KEPT, slim
from stepq.migrations import upgrade
from stepq.models import Database
from stepq.trainer.generative_judge.prompt import JudgePrompt
from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
from stepq.trainer.snapshots.export import snapshot_records
from tests.helpers import annotated_set


def _count(db: Path, table: str) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def test_a_slim_seed_reads_the_same_snapshot_without_the_annotation(sqlite: Database, tmp_path: Path) -> None:
    annotated_set(sqlite, problems=30, error_rate=0.25, recovery_rate=0.05)
    number = create_snapshot(sqlite, SnapshotSpec(("s",), "abs-q", 0.25, until_first_error=True))
    kept = Path(sqlite.url.removeprefix("sqlite:///")).parent
    (kept / "base").mkdir()
    (kept / "base" / "config.json").write_text("{}")
    for name in ("heldout.json", "tune.json", "template.txt"):
        (kept / name).write_text(name)
    (kept / "prepared.json").write_text(json.dumps({"snapshot": number}))
    before = snapshot_records(sqlite, number, JudgePrompt(JUDGE_TEMPLATE))
    assert _count(kept / "stepq.db", "rollouts") > 0

    out = tmp_path / "gpu" / "seed0-abs-q"
    size = slim(kept, out)

    assert _count(out / "stepq.db", "rollouts") == 0 and _count(out / "stepq.db", "chunks") == 0
    assert size < (kept / "stepq.db").stat().st_size
    assert all((out / name).exists() for name in KEPT) and (out / "base" / "config.json").is_file()
    url = f"sqlite:///{out / 'stepq.db'}"
    upgrade(url)  # as the benchmark opens it there
    cut = Database(url)
    try:
        after = snapshot_records(cut, number, JudgePrompt(JUDGE_TEMPLATE))
    finally:
        cut.dispose()
    assert after == before and sum(len(rows) for rows in after.values()) > 0
    assert _count(kept / "stepq.db", "rollouts") > 0  # the kept seed itself is untouched
