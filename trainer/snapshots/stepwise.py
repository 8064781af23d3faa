"""A snapshot in the common stepwise-supervision layout: ``prompt``, ``completions`` (the
steps, in order) and ``labels`` (one boolean per step), as PRM trainers read it.

Every label is the snapshot's own: nothing is relabelled on export.  A balanced snapshot
holds only some chunks of a trajectory, so each maximal run of consecutive labelled chunks
becomes one record, with the unlabelled chunks before it moved into the prompt (the problem,
a blank line, then those steps as written): the steps a record labels always follow what
its prompt shows.  An unbalanced snapshot (``--no-balance``) gives one record per trajectory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import groupby
from pathlib import Path
from typing import Any

from stepq.models import Database
from stepq.models.errors import ConfigError
from stepq.trainer.snapshots.export import snapshot_records
from stepq.trainer.snapshots.first_error import until_first_dead


def runs(indices: Sequence[int]) -> list[list[int]]:
    """Maximal runs of consecutive integers in a sorted sequence."""
    out: list[list[int]] = []
    for i in indices:
        if out and i == out[-1][-1] + 1:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def stepwise_records(db: Database, ref: str | int, until_first_error: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Records per split; ``until_first_error`` keeps each trajectory's rows before the first
    whose prefix is dead (``first_error``; of the rows the snapshot holds)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for split, rows in snapshot_records(db, ref).items():
        records = out.setdefault(split, [])
        if until_first_error:
            rows = until_first_dead(rows, lambda r: (r["trajectory_id"], r["chunk_index"], r["q_before"]))
        rows = sorted(rows, key=lambda r: (r["trajectory_id"], r["chunk_index"]))
        for trajectory_id, group in groupby(rows, key=lambda r: r["trajectory_id"]):
            by_index = {r["chunk_index"]: r for r in group}
            for run in runs(sorted(by_index)):
                first = by_index[run[0]]
                records.append(
                    {
                        "prompt": first["problem"] + "\n\n" + "".join(first["history"]),
                        "completions": [by_index[i]["chunk"] for i in run],
                        "labels": [by_index[i]["label"] == "Positive" for i in run],
                        "problem_id": first["problem_id"],
                        "trajectory_id": trajectory_id,
                        "first_step": run[0],
                    }
                )
    return out


def export_stepwise(db: Database, ref: str | int, out_dir: Path, *, until_first_error: bool = False) -> dict[str, int]:
    """Write ``train.jsonl`` and ``validation.jsonl`` (``datasets.load_dataset(DIR)``)."""
    records = stepwise_records(db, ref, until_first_error)
    if not any(records.values()):
        raise ConfigError(f"snapshot {ref} holds no rows")
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in records.items():
        with (out_dir / f"{split}.jsonl").open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return {split: len(rows) for split, rows in records.items()}
