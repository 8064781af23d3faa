"""Step-wise DPO on step preference pairs with TRL's ``DPOTrainer``: pairs Q-derived from a
set, chosen by a step search, or read from an export.

The model is passed to TRL by its path, so TRL builds the frozen reference model from the
same weights (with an in-memory model it would need an explicit ``ref_model``); a resumed
run reloads the policy from its checkpoint while the reference stays the base model.
"""

from __future__ import annotations

from pathlib import Path

from stepq.models import Database
from stepq.models.errors import ConfigError
from stepq.trainer.methods.base import Method, TrainingData, base_model
from stepq.trainer.preferences.export import preference_records, search_preference_records
from stepq.trainer.preferences.pair_files import fitting, load_preferences
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.runs import RunPlan, RunSpec, TrainOptions


class DPO(Method):
    name = "dpo"
    recipe = "step-dpo.yaml"
    summary = "step-wise DPO on step pairs (--set, --search or --data)"

    def plan(
        self, db: Database, recipe: Recipe, data: TrainingData, output_dir: Path, options: TrainOptions
    ) -> RunPlan:
        source = data.only(self.name, "--set", "--search", "--data", "records")
        if data.until_first_error:
            raise ConfigError("--until-first-error applies to step labels: use it with --method prm --snapshot")
        if source == "--search":
            assert data.search is not None
            pairs = search_preference_records(db, data.search)
            if not pairs:
                raise ConfigError(f"step search '{data.search}' has no pairs yet (see 'stepq search status')")
            dataset = f"preferences:search:{data.search}"
        elif source == "--data":
            assert data.data_dir is not None
            pairs, dataset = load_preferences(data.data_dir), f"preferences:{data.data_dir.resolve()}"
        elif source == "--set":
            assert data.set_name is not None
            pairs = preference_records(db, data.set_name, data.margin)
            dataset = f"preferences:{data.set_name}:margin={data.margin}"
        else:
            pairs, dataset = list(data.records or ()), data.source()
        if not pairs:
            raise ConfigError(f"{dataset} has no preference pairs to train on")
        from datasets import Dataset
        from trl import DPOConfig, DPOTrainer

        model = base_model(recipe, options)
        config = recipe.config(DPOConfig, output_dir, **(options.trainer_overrides or {}))
        pairs = fitting(pairs, model, getattr(config, "max_length", None), dataset)
        return RunPlan(
            RunSpec(self.name, recipe.text, model, output_dir, dataset=dataset),
            DPOTrainer,
            {"model": model, "args": config, "train_dataset": Dataset.from_list(pairs)},
            max_steps=int(config.max_steps or 0),
        )
