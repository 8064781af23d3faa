"""Freeze the currently labelled chunks of some sets into a numbered, immutable snapshot."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.trainer.snapshots.balance import LabelledChunk, content_hash, plan_snapshot
from stepq.trainer.snapshots.first_error import until_first_dead
from stepq.workers.labelling.labels import parse_rule


@dataclass(frozen=True)
class SnapshotSpec:
    sets: tuple[str, ...]
    rule: str
    val_fraction: float = 0.1
    seed: int = 0
    balanced: bool = True
    name: str | None = None
    lineage: str | None = None
    split_by: str = "external-id"
    """What a problem's side is hashed from: ``external-id`` (the same set splits the same way
    in every database) or ``row-id`` (snapshots made before; a lineage begun with it keeps it)."""
    until_first_error: bool = False
    """Keep each trajectory's chunks only while the prefix before them is alive (``q_before >
    0``), as first-error judges are trained (``first_error``); StepWiser's default is every
    labelled chunk."""
    balance_by_position: bool = False
    """Balance each chunk position on its own (``balance.balance``), so a step's place in its
    solution carries no information about its label; stepq's option, StepWiser balances the
    classes overall."""


SPLIT_KEYS = {"external-id": "external id (the same in every database)", "row-id": "row id in this database"}


def stepq_version() -> str:
    try:
        return version("stepq")
    except PackageNotFoundError:  # a checkout run without installing
        from stepq import __version__

        return __version__


def create_snapshot(db: Database, spec: SnapshotSpec) -> int:
    """Write the snapshot in one transaction and return its number.

    Rows carry label values and Q-values, not references to ``chunk_labels``, so nothing that
    happens to the labels later (relabelling, more rollouts, another rule) changes it.
    """
    if not spec.sets:
        raise ConfigError("a snapshot needs at least one problem set (--sets A,B)")
    if not 0 <= spec.val_fraction < 1:
        raise ConfigError(f"--val-fraction must be in [0, 1), got {spec.val_fraction}")
    rule = parse_rule(spec.rule).key
    if spec.balance_by_position and not spec.balanced:
        raise ConfigError("balancing by position needs balancing (drop --no-balance)")
    with db.session() as session:
        set_ids = queries.set_ids_by_name(session, list(spec.sets))
        rows = [LabelledChunk(*r) for r in queries.labelled_chunks(session, set_ids, rule)]
        seen = len(rows)
        if spec.until_first_error:
            rows = until_first_dead(rows, lambda r: (r.trajectory_id, r.chunk_idx, r.q_before))
        if not rows:
            raise ConfigError(
                f"no chunks of {', '.join(spec.sets)} are labelled under '{rule}' "
                f"(annotate them, or 'stepq label --set S --rule {rule}')"
            )
        if spec.split_by not in SPLIT_KEYS:
            raise ConfigError(f"split_by must be one of {', '.join(SPLIT_KEYS)}, got {spec.split_by!r}")
        keys = (
            queries.problem_external_ids(session, {r.problem_id for r in rows})
            if spec.split_by == "external-id"
            else None
        )
        plan = plan_snapshot(rows, spec.val_fraction, spec.seed, spec.balanced, keys, spec.balance_by_position)
        number = queries.next_snapshot_number(session)
        name = spec.name or f"snapshot-{number}"
        if queries.snapshot_name_taken(session, name):
            raise ConfigError(f"a snapshot named '{name}' exists already; snapshots are immutable")
        kept = [r for part in plan.splits.values() for r in part]
        if not kept:
            raise ConfigError("balancing left no rows: every split holds one class only")
        manifest: dict[str, Any] = {
            "sets": list(spec.sets),
            "rule": rule,
            "seed": spec.seed,
            "val_fraction": spec.val_fraction,
            "balanced": spec.balanced,
            "balance": (
                ("by position: each step index 50/50" if spec.balance_by_position else "overall: 50/50 per split")
                if spec.balanced
                else "none"
            ),
            "chunks": (
                "until the first error: a trajectory's chunks while the prefix before them is alive (q_before > 0)"
                if spec.until_first_error
                else "every labelled chunk"
            ),
            "until_first_error": spec.until_first_error,
            "split": f"by problem: a seeded hash of the problem's {SPLIT_KEYS[spec.split_by]}, so a problem keeps "
            "its side as sets grow",
            "split_by": spec.split_by,
            "counts_before_balancing": plan.counts_before,
            "counts": plan.counts_after,
            "problems": {s: len({r.problem_id for r in part}) for s, part in plan.splits.items()},
            "labelled_chunks_seen": seen,
            "labelled_chunks_kept": len(rows),
            "rollouts_behind_labels": queries.rollouts_behind(session, sorted({r.trajectory_id for r in kept})),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "stepq_version": stepq_version(),
        }
        digest = content_hash(plan.splits)
        manifest["content_hash"] = digest
        return queries.insert_snapshot(
            session,
            {
                "name": name,
                "lineage": spec.lineage,
                "rule": rule,
                "seed": spec.seed,
                "val_fraction": spec.val_fraction,
                "balanced": spec.balanced,
                "content_hash": digest,
                "manifest": manifest,
            },
            [
                {
                    "split": split,
                    "chunk_id": r.chunk_id,
                    "trajectory_id": r.trajectory_id,
                    "problem_id": r.problem_id,
                    "chunk_idx": r.chunk_idx,
                    "positive": r.positive,
                    "q_before": r.q_before,
                    "q_after": r.q_after,
                }
                for split, part in plan.splits.items()
                for r in part
            ],
        )


MIN_VALIDATION_ROWS = 100
"""Below this many validation rows a snapshot says its split is too small to weigh a judge on."""


def validation_note(counts: dict[str, dict[str, int]]) -> str | None:
    """A sentence when the validation split is too small to evaluate a judge on (the tour's
    held 4 rows without a word): an accuracy over n rows is uncertain by about 1.96·√(¼/n)."""
    n = sum(counts.get("validation", {}).values())
    if n >= MIN_VALIDATION_ROWS:
        return None
    if n == 0:
        return "no validation rows: 'stepq eval snapshot' has nothing to score (raise --val-fraction)"
    spread = 100 * 1.96 * (0.25 / n) ** 0.5
    return (
        f"the validation split holds {n} rows, too few to weigh a judge on (an accuracy over {n} rows is "
        f"uncertain by about ±{spread:.0f} points); raise --val-fraction or add problems"
    )


def parse_sets(text: str | Sequence[str]) -> tuple[str, ...]:
    items = text.split(",") if isinstance(text, str) else list(text)
    return tuple(s.strip() for s in items if s.strip())
