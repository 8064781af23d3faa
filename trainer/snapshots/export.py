"""A snapshot as judge-training records, and their export to Parquet or JSON Lines.

Each record carries the rendered judge prompt (problem, historical reasoning path = the
chunks before, new chunk), the label as ``Positive``/``Negative`` and the ids and Q-values
it came from; the files load with ``datasets.load_dataset(DIR)`` as ``train`` and
``validation`` splits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.models.snapshots import TRAIN, VALIDATION
from stepq.trainer.generative_judge.prompt import JudgePrompt, verdict_word

FORMATS = ("parquet", "jsonl")


def snapshot_records(
    db: Database, ref: str | int, template: JudgePrompt | None = None
) -> dict[str, list[dict[str, Any]]]:
    """The snapshot's records per split, in a stable order (split, chunk id)."""
    return _read(db, ref, template)[1]


def _read(
    db: Database, ref: str | int, template: JudgePrompt | None
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """The snapshot's manifest and records, read in one transaction."""
    prompt = template or JudgePrompt.load()
    with db.session() as session:
        snap = queries.get_snapshot(session, ref)
        rows = queries.snapshot_rows(session, snap.id)
        contexts = queries.snapshot_contexts(session, snap.id)
        snap_id, manifest = snap.id, dict(snap.manifest)
    out: dict[str, list[dict[str, Any]]] = {TRAIN: [], VALIDATION: []}
    for r in rows:
        ctx = contexts[r.trajectory_id]
        chunks: list[str] = ctx["chunks"]
        history, chunk = chunks[: r.chunk_idx - 1], chunks[r.chunk_idx - 1]
        out[r.split].append(
            {
                "snapshot": snap_id,
                "problem_set": ctx["set"],
                "problem_id": ctx["problem_id"],
                "trajectory_id": r.trajectory_id,
                "chunk_id": r.chunk_id,
                "chunk_index": r.chunk_idx,
                "n_chunks": len(chunks),
                "prompt": prompt.render(ctx["question"], history, chunk),
                "label": verdict_word(r.positive),
                "q_before": r.q_before,
                "q_after": r.q_after,
                "problem": ctx["question"],
                "history": history,
                "chunk": chunk,
            }
        )
    return manifest, out


def export_snapshot(db: Database, ref: str | int, out_dir: Path, fmt: str = "parquet") -> dict[str, int]:
    """Write ``train.<ext>``, ``validation.<ext>`` and ``manifest.json``; returns row counts."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format '{fmt}' (one of: {', '.join(FORMATS)})")
    manifest, records = _read(db, ref, None)
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in records.items():
        path = out_dir / f"{split}.{fmt}"
        if fmt == "jsonl":
            with path.open("w", encoding="utf-8") as fh:
                for row in rows:
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        else:
            _write_parquet(path, rows)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return {split: len(rows) for split, rows in records.items()}


def _write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - the train extra brings it
        raise ConfigError("Parquet export needs pyarrow: pip install 'stepq[train]' (or use --format jsonl)") from None
    schema = pa.schema(
        [
            ("snapshot", pa.int64()),
            ("problem_set", pa.string()),
            ("problem_id", pa.string()),
            ("trajectory_id", pa.int64()),
            ("chunk_id", pa.int64()),
            ("chunk_index", pa.int64()),
            ("n_chunks", pa.int64()),
            ("prompt", pa.string()),
            ("label", pa.string()),
            ("q_before", pa.float64()),
            ("q_after", pa.float64()),
            ("problem", pa.string()),
            ("history", pa.list_(pa.string())),
            ("chunk", pa.string()),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
