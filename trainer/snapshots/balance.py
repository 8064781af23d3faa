"""The pure part of a snapshot: split by problem, balance classes, hash the content.

Everything here is a function of its inputs and a seed, so the same labelled chunks and the
same seed give the same snapshot, byte for byte, on any machine.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from stepq.models.snapshots import TRAIN, VALIDATION


@dataclass(frozen=True, order=True)
class LabelledChunk:
    """One labelled chunk as a snapshot stores it (ordered by chunk id for determinism)."""

    chunk_id: int
    trajectory_id: int
    problem_id: int
    chunk_idx: int
    positive: bool
    q_before: float
    q_after: float


def validation_side(problem_id: int | str, val_fraction: float, seed: int) -> bool:
    """Whether a problem belongs to validation: a seeded hash of its id, below the fraction.

    The side is a function of the problem alone (not of which other problems the snapshot
    holds), so as sets grow across a lineage's snapshots, a problem never moves from one
    snapshot's train split into a later one's validation split.
    """
    if val_fraction <= 0:
        return False
    digest = hashlib.sha256(f"split:{seed}:{problem_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < val_fraction


def validation_problems(problem_ids: Iterable[int | str], val_fraction: float, seed: int) -> set[int | str]:
    """The problems that go to validation (``validation_side``): about ``val_fraction`` of them.

    Splitting problems, not chunks, keeps every chunk of a problem on one side, so a judge is
    never validated on a problem whose other steps it was trained on.
    """
    return {p for p in set(problem_ids) if validation_side(p, val_fraction, seed)}


def balance(rows: Sequence[LabelledChunk], seed: int, by_position: bool = False) -> list[LabelledChunk]:
    """Down-sample the majority class to exactly the minority's count (StepWiser: without it
    the judge collapses toward "Positive").  A split with one class only becomes empty.

    ``by_position`` balances each chunk position (step index) on its own, so where a step
    stands in its solution says nothing about its label: under Abs-Q late steps are mostly
    Negative, and a judge rewarded for matching labels can learn the position instead of the
    check (docs/experiments/judge_grpo.md).  stepq's option, not StepWiser's."""
    if by_position:
        at: dict[int, list[LabelledChunk]] = {}
        for r in rows:
            at.setdefault(r.chunk_idx, []).append(r)
        return sorted(r for idx in sorted(at) for r in balance(at[idx], seed + 7919 * idx))
    pos = sorted(r for r in rows if r.positive)
    neg = sorted(r for r in rows if not r.positive)
    n = min(len(pos), len(neg))
    rng = random.Random(f"balance:{seed}:{len(pos)}:{len(neg)}")
    kept = rng.sample(pos, n) + rng.sample(neg, n)
    return sorted(kept)


def class_counts(rows: Iterable[LabelledChunk]) -> dict[str, int]:
    rows = list(rows)
    positive = sum(r.positive for r in rows)
    return {"positive": positive, "negative": len(rows) - positive}


@dataclass(frozen=True)
class SnapshotPlan:
    """What a snapshot will hold, with the counts its manifest records."""

    splits: dict[str, list[LabelledChunk]]
    counts_before: dict[str, dict[str, int]]
    counts_after: dict[str, dict[str, int]]


def plan_snapshot(
    rows: Sequence[LabelledChunk],
    val_fraction: float,
    seed: int,
    balanced: bool,
    split_keys: Mapping[int, str] | None = None,
    by_position: bool = False,
) -> SnapshotPlan:
    """Split by problem, then balance each split on its own (each must be 50/50).

    ``split_keys`` names each problem by what identifies it outside this database (its
    external id), so the same set splits the same way in any database; without it, by row id
    (snapshots made before, whose lineages keep it)."""

    def key(problem_id: int) -> int | str:
        return problem_id if split_keys is None else split_keys[problem_id]

    val = validation_problems((key(r.problem_id) for r in rows), val_fraction, seed)
    raw = {
        TRAIN: sorted(r for r in rows if key(r.problem_id) not in val),
        VALIDATION: sorted(r for r in rows if key(r.problem_id) in val),
    }
    splits = {name: balance(part, seed, by_position) if balanced else part for name, part in raw.items()}
    return SnapshotPlan(
        splits=splits,
        counts_before={name: class_counts(part) for name, part in raw.items()},
        counts_after={name: class_counts(part) for name, part in splits.items()},
    )


def content_hash(splits: Mapping[str, Sequence[LabelledChunk]]) -> str:
    """SHA-256 of what the snapshot holds (split, chunk, label, Q-values), order-independent."""
    h = hashlib.sha256()
    for name in sorted(splits):
        for r in sorted(splits[name]):
            h.update(f"{name}|{r.chunk_id}|{int(r.positive)}|{r.q_before!r}|{r.q_after!r}\n".encode())
    return h.hexdigest()
