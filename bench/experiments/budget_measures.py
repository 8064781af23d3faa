"""What the budget experiments measure on an annotated set: its labels under a rule, counts
by SQL, and agreement with the truth.  Shared by ``bench_budget`` and ``budget_neural``."""

from __future__ import annotations

from sqlalchemy import text

from bench.experiments.budget_replay import trajectory_key
from stepq.models import Database
from stepq.workers.labelling.labels import LabelRule

RULES = ["abs-q", "rel-ratio", "rel-effective"]


def labels(db: Database, name: str, rule: LabelRule, per_trajectory: bool = False) -> dict[tuple[str, int], bool]:
    """A set's labels under ``rule`` by (``trajectory_key``, chunk index)."""
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT p.external_id, t.source_key, c.idx, l.positive FROM chunk_labels l "
                "JOIN chunks c ON c.id = l.chunk_id "
                "JOIN trajectories t ON t.id = c.trajectory_id JOIN problems p ON p.id = t.problem_id "
                "JOIN problem_sets s ON s.id = p.problem_set_id WHERE s.name = :n AND l.rule = :r"
            ),
            {"n": name, "r": rule.key},
        )
        return {(trajectory_key(ext, src, per_trajectory), idx): bool(pos) for ext, src, idx, pos in rows}


def count(db: Database, name: str, sql: str) -> int:
    with db.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    f"SELECT {sql} FROM trajectories t JOIN problems p ON p.id = t.problem_id "
                    "JOIN problem_sets s ON s.id = p.problem_set_id "
                    "LEFT JOIN rollouts r ON r.trajectory_id = t.id WHERE s.name = :n"
                ),
                {"n": name},
            ).scalar_one()
        )


def accuracy(got: dict[tuple[str, int], bool], want: dict[tuple[str, int], bool]) -> float:
    return sum(got.get(k) == v for k, v in want.items()) / len(want)
