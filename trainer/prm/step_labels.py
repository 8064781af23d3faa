"""A snapshot's step labels as a discriminative PRM's training examples (the step-label PRM).

Most PRMs trained on Monte Carlo step labels (Math-Shepherd, OmegaPRM and the open PRMs since)
score every step and learn each step's label: hard, the snapshot's rule (Math-Shepherd's hard
estimate is Abs-Q: right when some rollout from after the step reaches the answer), or soft,
the chunk's Q-value itself.  The examples are made from the rows the stepwise-supervision export
writes (``methods.prm.snapshot_steps`` reads them), so the two never disagree.  A
trajectory becomes one example: its steps up to the last labelled one,
read whole as the PRM reads a solution when it scores it, each with its target or None (a step
the snapshot does not hold, such as one a balanced snapshot left out: context only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

from stepq.models.errors import ConfigError

TARGETS = ("hard", "soft")


@dataclass(frozen=True)
class StepExample:
    problem: str
    steps: tuple[str, ...]
    targets: tuple[float | None, ...]
    """One per step: 1.0 / 0.0 (hard), the chunk's Q-value (soft), or None (no label)."""


def examples_from_rows(rows: Sequence[dict[str, Any]], targets: str = "hard") -> list[StepExample]:
    """Snapshot rows (``snapshot_records``) grouped into one example per trajectory."""
    if targets not in TARGETS:
        raise ConfigError(f"step targets '{targets}' is not one of: {', '.join(TARGETS)}")
    out = []
    ordered = sorted(rows, key=lambda r: (r["trajectory_id"], r["chunk_index"]))
    for _, group in groupby(ordered, key=lambda r: r["trajectory_id"]):
        by_index = {r["chunk_index"]: r for r in group}
        last = by_index[max(by_index)]
        steps = (*last["history"], last["chunk"])
        values: list[float | None] = []
        for i in range(1, len(steps) + 1):
            row = by_index.get(i)
            if row is None:
                values.append(None)
            elif targets == "soft":
                if row["q_after"] is None:
                    raise ConfigError(f"trajectory {row['trajectory_id']} chunk {i} has no Q-value for a soft target")
                values.append(float(row["q_after"]))
            else:
                values.append(1.0 if row["label"] == "Positive" else 0.0)
        out.append(StepExample(last["problem"], steps, tuple(values)))
    return out
