"""GRPO: the StepWiser judge trained on a snapshot with TRL's ``GRPOTrainer``.

The method builds the prompts (the snapshot's train split through the judge template), the
rewards and the config, and keeps ``stepq-judge.json`` (how the judge was prompted, and on
which sets) beside the model; ``runs.execute`` does the rest.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from stepq.models import Database
from stepq.models.errors import ConfigError
from stepq.models.snapshots import TRAIN
from stepq.trainer.generative_judge.judge_prompting import FILE as JUDGE_SETTINGS
from stepq.trainer.generative_judge.judge_prompting import settings_for_training
from stepq.trainer.generative_judge.prompt import JudgePrompt
from stepq.trainer.generative_judge.rewards import get_rewards
from stepq.trainer.generative_judge.training_range import snapshot_sets
from stepq.trainer.methods.base import Method, TrainingData, base_model
from stepq.trainer.snapshots.export import snapshot_records
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.records import ClassAccuracy
from stepq.trainer.training.runs import RunPlan, RunSpec, TrainOptions

log = logging.getLogger(__name__)


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


class GRPO(Method):
    """The generative judge (StepWiser's), by GRPO on a balanced snapshot."""

    name = "grpo"
    recipe = "stepwiser-judge.yaml"
    summary = "the generative judge on a snapshot"
    trains_on_snapshots = True
    judge_runs_folder = True

    def plan(
        self, db: Database, recipe: Recipe, data: TrainingData, output_dir: Path, options: TrainOptions
    ) -> RunPlan:
        data.only(self.name, "--snapshot")
        if data.until_first_error:
            raise ConfigError("--until-first-error is a snapshot's choice for a judge: make the snapshot with it")
        from trl import GRPOConfig, GRPOTrainer

        snapshot = data.snapshot_id(db)
        model = base_model(recipe, options)
        config = recipe.config(GRPOConfig, output_dir, **(options.trainer_overrides or {}))
        template = judge_template(recipe)
        warn_if_positions_shift(model)
        accuracy = ClassAccuracy()
        rewards: list[Any] = [accuracy.wrap(fn) if i == 0 else fn for i, fn in enumerate(get_rewards(recipe.rewards))]
        # how this judge is prompted, for its evaluation
        prompting = settings_for_training(
            template, recipe.conversational, int(config.max_completion_length), snapshot_sets(db, snapshot)
        )
        return RunPlan(
            RunSpec(self.name, recipe.text, model, output_dir, snapshot_id=snapshot),
            GRPOTrainer,
            {
                "model": model,
                "reward_funcs": rewards,
                "args": config,
                "train_dataset": judge_dataset(db, snapshot, recipe, template),
            },
            max_steps=int(config.max_steps or 0),
            side_files={JUDGE_SETTINGS: prompting.as_dict()},
            accuracy=accuracy,
        )
