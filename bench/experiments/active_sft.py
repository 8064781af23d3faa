"""stepq's own generative judge as ``bench_active``'s judge (``--judge sft``): the spelled judge
of the capacity check, which learns the check from stepq's labels in minutes on 2 cores.

Each round:
1. a first-error snapshot of every label the set holds so far, balanced by position
   (``stepq snapshot create --until-first-error --balance-by-position``);
2. the judge taught its training rows by cross-entropy through the method registry (``stepq
   train --method sft``: the spelled analysis, then the Monte Carlo label as the verdict), from
   the seed's backbone (pretrained once, with the spelling's drills, and shared by every round
   and strategy), as a training run of the arm's database;
3. the priority round scores the waiting trajectories through the worker's own judge factory
   (``ScoringJudges``: the run's ``final/``, asked greedily, P(Positive) read at its verdict:
   ``score=logprob``), and the benchmark evaluates that same judge.

A fresh round on labels trained on before (every strategy's first round: random order for all)
is the same run in one folder named by its inputs: the executor finds its checkpoint complete
and takes it instead of training again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.experiments.judge_backbone import BackboneRecipe, built_backbone
from bench.experiments.judge_capacity import CPU, Device, sft_recipe, verdict_examples
from stepq.models import Database

ANALYSIS = "spelled"
SCORE = "score=logprob"
"""How the round's judge scores a step: one greedy answer, P(Positive) at its verdict."""


@dataclass(frozen=True)
class SFTSettings:
    """The judge's size and teaching: the capacity check's spelled judge (2 layers, width 64)."""

    width: int = 64
    layers: int = 2
    pretrain_problems: int = 2000
    pretrain_steps: int = 3000
    steps: int = 1500
    batch: int = 16
    lr: float = 1e-3


def build_backbone(root: Path, settings: SFTSettings, seed: int, device: Device = CPU) -> Path:
    """The seed's backbone, pretrained on correct solutions and the spelling's drills, once."""
    base = root / f"sft-base-w{settings.width}-l{settings.layers}"
    recipe = BackboneRecipe(
        seed, settings.layers, settings.width, settings.pretrain_problems, settings.pretrain_steps, "small",
        drills=settings.pretrain_problems,
    )  # fmt: skip
    built_backbone(base, recipe, device)  # or verified against its record
    return base


def round_rows(db: Database, set_name: str, seed: int, round_no: int) -> list[dict[str, Any]]:
    """The round's snapshot (every label so far, first-error form, balanced by position): its
    training rows."""
    from stepq.models.snapshots import TRAIN
    from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
    from stepq.trainer.snapshots.export import snapshot_records

    spec = SnapshotSpec(
        (set_name,),
        "abs-q",
        val_fraction=0.1,
        seed=seed,
        name=f"round-{round_no}",
        until_first_error=True,
        balance_by_position=True,
    )
    return list(snapshot_records(db, create_snapshot(db, spec))[TRAIN])


def round_judge(
    db: Database, base: Path, rows: Sequence[dict[str, Any]], settings: SFTSettings, seed: int, device: Device = CPU
) -> int:
    """Teach one round's judge (``methods.train``, what ``stepq train --method sft`` runs) as
    a training run of ``db``; returns the run's id."""
    from stepq.trainer import methods
    from stepq.trainer.training.runs import TrainOptions

    records = [{"prompt": p, "completion": a} for p, a in verdict_examples(rows, "label", ANALYSIS)]
    key = hashlib.sha256(json.dumps([str(base), repr(settings), seed, records]).encode()).hexdigest()[:16]
    folder = base.parent / "sft-rounds" / key
    folder.mkdir(parents=True, exist_ok=True)
    recipe = sft_recipe(base, folder / "template.txt", settings.steps, settings.batch, settings.lr, seed, device)
    data = methods.TrainingData(records=records, name=f"bench-active:spelled-verdicts:{key}")
    return methods.train(db, "sft", recipe, data, folder / "run", TrainOptions()).run_id


def load_judge(db: Database, run_id: int) -> Any:
    """The run's judge as a priority round's worker builds it (and scores with)."""
    from stepq.trainer.evaluation.scoring_judges import ScoringJudges
    from stepq.workers.priority.strategies import parse_strategy

    return ScoringJudges(db)(run_id, parse_strategy(f"uncertainty:run={run_id},{SCORE}"))
