"""``stepq export preferences``: Q-derived step pairs as a ``datasets``-loadable set for TRL's
``DPOTrainer`` (``prompt``, ``chosen``, ``rejected``, plus where each pair came from)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.trainer.preferences.pairs import ScoredTrajectory, StepPair, prompt_of, q_pairs

FORMATS = ("jsonl", "parquet")


def preference_records(db: Database, set_name: str, margin: float) -> list[dict[str, Any]]:
    with db.session() as session:
        rows = queries.scored_trajectories(session, set_name)
    scored = [ScoredTrajectory(r["id"], r["problem_id"], r["question"], r["chunks"], r["q"], r["prompt"]) for r in rows]
    return [pair_record(p) for p in q_pairs(scored, margin)]


def search_preference_records(db: Database, name: str) -> list[dict[str, Any]]:
    """The (best, worst) pairs a step search's pairwise judge chose, one per advancing turn
    whose kept step was not rolled back (a rollback discards that step's pair too)."""
    from itertools import groupby

    from stepq.models import queries
    from stepq.workers.search.step_search import surviving_pairs

    with db.session() as session:
        turns = queries.search_turn_rows(session, name)
    rows = []
    for _, group in groupby(turns, key=lambda r: r["search_id"]):
        of_search = list(group)
        rows += [of_search[i] for i in surviving_pairs([r["action"] for r in of_search])]
    return [
        {
            "prompt": prompt_of(r["policy_prompt"], r["prefix"]),
            "chosen": r["chosen"],
            "rejected": r["rejected"],
            "problem_id": r["problem_id"],
            "prefix_len": len(r["prefix"]),
            "search_id": r["search_id"],
            "turn": r["turn"],
            "wins_chosen": r["wins_chosen"],
            "wins_rejected": r["wins_rejected"],
        }
        for r in rows
    ]


def pair_record(p: StepPair) -> dict[str, Any]:
    """A DPO record: the step with the higher Q is ``chosen``, in the context it was sampled in."""
    return {
        "prompt": prompt_of(p.policy_prompt, p.prefix),
        "chosen": p.chosen,
        "rejected": p.rejected,
        "problem_id": p.problem_id,
        "prefix_len": len(p.prefix),
        "q_chosen": p.q_chosen,
        "q_rejected": p.q_rejected,
        "chosen_trajectory": p.chosen_trajectory,
        "rejected_trajectory": p.rejected_trajectory,
    }


def export_preferences(
    db: Database, set_name: str | None, out: Path, *, margin: float, fmt: str = "jsonl", search: str | None = None
) -> int:
    """Write ``train.<fmt>`` under ``out`` (``datasets.load_dataset(out)`` reads it): the
    Q-derived pairs of a set, or a step search's judged pairs; returns how many pairs."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format '{fmt}' (one of: {', '.join(FORMATS)})")
    if not 0 < margin <= 1:
        raise ConfigError("--margin must be in (0, 1]")
    if (set_name is None) == (search is None):
        raise ConfigError("give exactly one of --set (Q-derived pairs) and --search (a step search's pairs)")
    if search is not None:
        records = search_preference_records(db, search)
        if not records:
            raise ConfigError(f"step search '{search}' has no pairs yet (run its searches: 'stepq search status')")
    else:
        assert set_name is not None
        records = preference_records(db, set_name, margin)
    if not records:
        raise ConfigError(
            f"set '{set_name}' yields no step pairs with a Q gap of {margin}: it needs several annotated "
            "trajectories per problem ('stepq generate --samples K', then 'stepq annotate')"
        )
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        with (out / "train.jsonl").open("w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), out / "train.parquet")
    return len(records)
