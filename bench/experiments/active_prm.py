"""stepq's own discriminative PRM as ``bench_active``'s judge (``--judge prm``).

Each round trains the step-label PRM (``stepq train --method prm`` on records: a tiny
character-level GPT-2 with the PRM's step head) on the Monte Carlo labels the set holds so far,
one binary cross-entropy per step on the hard label (Math-Shepherd's training), through the
method registry, so the round is a training run like any other.  The priority round then loads
it through the worker's own judge factory (``ScoringJudges``: ``final/`` of the run's output
folder, wrapped as ``PRMJudge``), as a fleet's workers build any round's judge.

Every labelled step trains, after a wrong one too (Math-Shepherd's data): the PRM's score of a
step is then the chance that the solution is still right there, the quantity the held-out truth
(every step after the first wrong one is wrong) and the priority strategies read.  The stand-in
instead learns each step alone, from the steps up to the first negative label, and takes the
running minimum; a PRM trained on those would learn a per-step hazard and score every later
step of a broken solution as if the solution were whole.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text

from stepq.models import Database


@dataclass(frozen=True)
class PRMSettings:
    """The judge's size and training: small enough for a round to train on CPU in minutes."""

    width: int = 64
    layers: int = 2
    steps: int = 600
    batch_size: int = 32
    lr: float = 1e-3
    warm_start: bool = False
    """Continue from the previous round's judge instead of the fresh backbone each round."""


def labelled_solutions(db: Database) -> list[tuple[str, list[str], list[bool]]]:
    """(problem, steps, labels) per labelled trajectory, every labelled step in order."""
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.trajectory_id, p.question, c.text, l.positive FROM chunk_labels l "
                "JOIN chunks c ON c.id = l.chunk_id JOIN trajectories t ON t.id = c.trajectory_id "
                "JOIN problems p ON p.id = t.problem_id ORDER BY c.trajectory_id, c.idx"
            )
        ).all()
    out: dict[int, tuple[str, list[str], list[bool]]] = {}
    for tid, question, chunk, positive in rows:
        _, steps, labels = out.setdefault(tid, (question, [], []))
        steps.append(chunk)
        labels.append(bool(positive))
    return list(out.values())


def build_backbone(root: Path, settings: PRMSettings, seed: int) -> Path:
    """A random-weight character GPT-2 for the seed, built once and shared by its arms."""
    from stepq.trainer.tiny_model import build_tiny_model

    base = root / f"prm-base-w{settings.width}-l{settings.layers}"
    if not (base / "config.json").is_file():
        build_tiny_model(base, seed=seed, n_positions=512, n_embd=settings.width, n_layer=settings.layers, n_head=2)
    return base


def round_recipe(base: Path, settings: PRMSettings, seed: int) -> Any:
    """The round's PRM recipe: AdamW at a constant rate (no warm-up), the gradient clipped at 1,
    the paper's MLP head, one checkpoint at the end."""
    from stepq.trainer.training.recipe import Recipe

    return Recipe.parse(
        f"""method: prm
model: {base}
trainer:
  head: mlp
  learning_rate: {settings.lr}
  weight_decay: 0.01
  warmup_steps: 0
  max_grad_norm: 1.0
  batch_size: {settings.batch_size}
  epochs: 100000
  max_steps: {settings.steps}
  max_length: 512
  save_steps: {settings.steps}
  logging_steps: {max(1, settings.steps // 4)}
  seed: {seed}
"""
    )


def round_judge(
    db: Database,
    base: Path,
    previous: Path | None,
    solutions: Sequence[tuple[str, list[str], list[bool]]],
    out: Path,
    settings: PRMSettings,
    seed: int,
) -> int:
    """Train one round's PRM as a training run of ``db`` (``methods.train``, what ``stepq
    train --method prm`` runs); returns the run's id, its model in ``final/`` of its folder.

    A fresh start on labels trained on before (every arm's first round: random order for all)
    is the same run (same data, recipe and seed), kept in one folder named by its inputs: the
    executor finds its last checkpoint complete and takes it as the model instead of training
    again, whichever arm's database records it."""
    from stepq.trainer import methods
    from stepq.trainer.prm.step_labels import StepExample
    from stepq.trainer.training.runs import TrainOptions

    fresh = not (settings.warm_start and previous is not None)
    start = base if fresh else previous
    assert start is not None
    key = hashlib.sha256(json.dumps([str(start), repr(settings), seed, solutions]).encode()).hexdigest()[:16]
    folder = base.parent / "prm-rounds" / key if fresh else out
    examples = [
        StepExample(q, tuple(steps), tuple(1.0 if label else 0.0 for label in labels)) for q, steps, labels in solutions
    ]
    data = methods.TrainingData(records=examples, name=f"bench-active:step-labels:{key}")
    result = methods.train(db, "prm", round_recipe(start, settings, seed), data, folder, TrainOptions())
    return result.run_id


def load_judge(db: Database, run_id: int) -> Any:
    """The run's judge as a priority round's worker builds it."""
    from stepq.trainer.evaluation.scoring_judges import ScoringJudges
    from stepq.workers.priority.strategies import parse_strategy

    return ScoringJudges(db)(run_id, parse_strategy(f"uncertainty:run={run_id}"))


def final_model(db: Database, run_id: int) -> Path:
    """Where a round's run keeps its model (the next round's start, warm-started)."""
    from stepq.models import queries
    from stepq.trainer.training.runs import FINAL

    with db.session() as session:
        return Path(queries.get_run(session, run_id).output_dir) / FINAL
