"""Train the StepWiser judge on a snapshot with TRL's GRPOTrainer, recorded in the database.

The run's life (identity by output directory, lease, resume, how it ended) is
``runs.recorded_run``'s; this module builds the dataset, the rewards and the trainer.  The
final model is saved to ``OUTPUT/final``.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.models.snapshots import TRAIN
from stepq.trainer.generative_judge.judge_prompting import FILE as JUDGE_SETTINGS
from stepq.trainer.generative_judge.judge_prompting import settings_for_training
from stepq.trainer.generative_judge.prompt import JudgePrompt
from stepq.trainer.generative_judge.rewards import get_rewards
from stepq.trainer.generative_judge.training_range import snapshot_sets
from stepq.trainer.snapshots.export import snapshot_records
from stepq.trainer.training.ranks import current_rank
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.records import ClassAccuracy
from stepq.trainer.training.runs import FINAL, RunHandle, RunSpec, TrainOptions, TrainResult, recorded_trl_run

log = logging.getLogger(__name__)

__all__ = ["FINAL", "TrainOptions", "TrainResult", "judge_dataset", "train_judge"]


def judge_template(recipe: Recipe) -> JudgePrompt:
    """The recipe's judge template (or the shipped one), read once per run."""
    return JudgePrompt.load(recipe.judge_template) if recipe.judge_template else JudgePrompt.load()


def judge_dataset(db: Database, snapshot: str | int, recipe: Recipe, template: JudgePrompt | None = None) -> Any:
    """The snapshot's train split as TRL prompts, with ``label`` for the rewards."""
    from datasets import Dataset

    rows = snapshot_records(db, snapshot, template or judge_template(recipe))[TRAIN]
    if not rows:
        raise ConfigError(f"snapshot {snapshot} has no training rows")

    def prompt(text: str) -> Any:
        return [{"role": "user", "content": text}] if recipe.conversational else text

    return Dataset.from_list(
        [{"prompt": prompt(r["prompt"]), "label": r["label"], "chunk_id": r["chunk_id"]} for r in rows]
    )


ABSOLUTE_POSITIONS = ("gpt2", "opt", "gpt_bigcode", "biogpt", "gpt_neo")


def warn_if_positions_shift(base_model: str) -> None:
    """TRL pads GRPO prompts on the left and computes the training log-probabilities without
    position ids: a model with learned absolute positions (GPT-2 and kin) then reads each
    prompt at shifted positions, unlike when it generated, and (on the benchmark) did not
    learn.  Rotary models (Llama, Qwen, ...) are unaffected: say so before hours are spent."""
    from transformers import AutoConfig

    try:
        model_type = AutoConfig.from_pretrained(base_model).model_type
    except (OSError, ValueError):
        return
    if model_type in ABSOLUTE_POSITIONS:
        log.warning(
            "%s is a %s model with absolute position embeddings: GRPO's left-padded batches shift its "
            "positions in the training pass (TRL passes no position ids); prefer a rotary model",
            base_model,
            model_type,
        )


def train_judge(
    db: Database,
    snapshot: str | int,
    recipe: Recipe,
    output_dir: Path,
    options: TrainOptions | None = None,
    on_step: Callable[[], None] | None = None,
) -> TrainResult:
    """Train (or resume, or report as done) the GRPO run that writes to ``output_dir``."""
    options = options or TrainOptions()
    output_dir = output_dir.resolve()
    base_model = options.base_model or recipe.model
    with db.session() as session:
        snapshot_id = queries.get_snapshot(session, snapshot).id
    spec = RunSpec("grpo", recipe.text, base_model, output_dir, snapshot_id=snapshot_id)
    # built before the run row: a setting this machine cannot honour leaves no row behind
    config = recipe.grpo_config(output_dir, **(options.trainer_overrides or {}))

    template = judge_template(recipe)

    def prepare(handle: RunHandle) -> None:
        if handle.run_id is not None:  # the main rank: how this judge is prompted, for its evaluation
            length = int(config.max_completion_length)
            learnt = snapshot_sets(db, snapshot)
            settings_for_training(template, recipe.conversational, length, handle.run_id, learnt).save(output_dir)

    from trl import GRPOTrainer

    warn_if_positions_shift(base_model)
    dataset = judge_dataset(db, snapshot, recipe, template)
    accuracy = ClassAccuracy()
    rewards: list[Any] = [accuracy.wrap(fn) if i == 0 else fn for i, fn in enumerate(get_rewards(recipe.rewards))]
    result = recorded_trl_run(
        db,
        spec,
        options,
        lambda recorder: GRPOTrainer(
            model=base_model, reward_funcs=rewards, args=config, train_dataset=dataset, callbacks=[recorder]
        ),
        prepare=prepare,
        accuracy=accuracy,
        on_step=on_step,
        max_steps=int(config.max_steps or 0),
    )
    saved = output_dir / JUDGE_SETTINGS
    if current_rank().is_main and saved.is_file() and result.final_model.is_dir():
        shutil.copyfile(saved, result.final_model / JUDGE_SETTINGS)
    return result
