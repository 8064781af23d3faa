"""Shared set-up for the trainer tests: tiny recipes, and training through the methods' registry."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stepq.models import Database
from stepq.trainer import methods
from stepq.trainer.methods import TrainingData
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.runs import TrainOptions, TrainResult


def tiny_recipe(path: Path, model: Path, max_steps: int = 3, save_steps: int = 2, completion_length: int = 12) -> Path:
    """The shipped recipe's method (GRPO, 4 generations, clip-higher, no KL) at toy size."""
    path.write_text(
        f"""model: {model}
rewards: [verdict-match, format]
conversational: false
trainer:
  num_generations: 4
  per_device_train_batch_size: 4
  max_completion_length: {completion_length}
  max_steps: {max_steps}
  learning_rate: 1.0e-4
  loss_type: grpo
  epsilon: 0.2
  epsilon_high: 0.28
  beta: 0.0
  logging_steps: 1
  save_steps: {save_steps}
  use_cpu: true
  seed: 0
"""
    )
    return path


def prm_recipe(
    model: Path, max_steps: int = 4, save_steps: int = 2, aggregate: str = "asymmetric", extra: str = ""
) -> Recipe:
    """A PRM recipe for a tiny model: a few steps, checkpoints every ``save_steps``."""
    return Recipe.parse(
        f"method: prm\nmodel: {model}\ntrainer:\n  aggregate: {aggregate}\n  learning_rate: 0.001\n  warmup_steps: 0\n"
        f"  batch_size: 4\n  epochs: 50\n  max_steps: {max_steps}\n  save_steps: {save_steps}\n"
        f"  logging_steps: 1\n  seed: 0\n{extra}"
    )


def train_records(
    db: Database,
    method: str,
    records: Sequence[Any],
    name: str,
    recipe: Recipe,
    output: Path,
    options: TrainOptions | None = None,
) -> TrainResult:
    """Train ``method`` on examples built in the test, through the registry as every trainer does."""
    data = TrainingData(records=list(records), name=name)
    return methods.train(db, method, recipe, data, output, options or TrainOptions())


def train_snapshot(
    db: Database, snapshot: int | str, recipe: Path | Recipe, output: Path, options: TrainOptions | None = None
) -> TrainResult:
    """Train the recipe's method on a snapshot, through the registry."""
    loaded = recipe if isinstance(recipe, Recipe) else Recipe.load(recipe)
    data = TrainingData(snapshot=str(snapshot))
    return methods.train(db, loaded.method, loaded, data, output, options or TrainOptions())
