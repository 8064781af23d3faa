"""The discriminative PRM (stepq's own trainer: TRL no longer ships one): on a snapshot's step
labels (the step-label PRM, Math-Shepherd's practice), or on outcome-labelled solutions (from
a set, or an export): the same backbone, head and aggregators either way."""

from __future__ import annotations

from pathlib import Path

from stepq.models import Database
from stepq.models.errors import ConfigError
from stepq.models.snapshots import TRAIN
from stepq.trainer.methods.base import Method, TrainingData, base_model
from stepq.trainer.outcomes.export import OutcomeFilter, outcome_records
from stepq.trainer.prm.step_labels import StepExample, examples_from_rows
from stepq.trainer.prm.train import OutcomeExample, PRMConfig, PRMTrainer, load_outcomes
from stepq.trainer.snapshots.export import snapshot_records
from stepq.trainer.snapshots.first_error import until_first_dead
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.runs import RunPlan, RunSpec, TrainOptions


class PRM(Method):
    name = "prm"
    recipe = "outcome-prm.yaml"
    summary = "a discriminative PRM on a snapshot's step labels (--snapshot) or on outcomes (--set, --data)"
    trains_on_snapshots = True
    one_process = True  # its model is small: stepq's trainer has no multi-process path

    def plan(
        self, db: Database, recipe: Recipe, data: TrainingData, output_dir: Path, options: TrainOptions
    ) -> RunPlan:
        source = data.only(self.name, "--snapshot", "--set", "--data", "records")
        config = recipe.config(PRMConfig, **(options.trainer_overrides or {}))
        if data.until_first_error and source != "--snapshot":
            raise ConfigError("--until-first-error applies to step labels: use it with --snapshot")
        if source in ("--data", "records") and data.outcomes != OutcomeFilter():
            raise ConfigError(
                "--pass-rate, --keep-unparseable and --prefix-rollouts apply to --set "
                "(filter an export as it is written)"
            )
        snapshot_id = None
        examples: list[OutcomeExample] | list[StepExample]
        if source == "--snapshot":
            snapshot_id = data.snapshot_id(db)
            examples = snapshot_steps(
                db, snapshot_id, targets=config.step_targets, until_first_error=data.until_first_error
            )
            cut = ":until-first-error" if data.until_first_error else ""
            dataset = f"steps:snapshot-{snapshot_id}:{config.step_targets}{cut}"  # which labels, in which form
        elif source == "--data":
            assert data.data_dir is not None
            examples, dataset = load_outcomes(data.data_dir), f"outcomes:{data.data_dir.resolve()}"
        elif source == "--set":
            assert data.set_name is not None
            examples = set_outcomes(db, data.set_name, data.outcomes)
            dataset = f"outcomes:{data.set_name}{data.outcomes.describe()}"
        else:
            examples, dataset = list(data.records or ()), data.source()
        if not examples:
            raise ConfigError(f"{dataset} has no labelled solutions to train on")
        model = base_model(recipe, options)
        return RunPlan(
            RunSpec(self.name, recipe.text, model, output_dir, snapshot_id=snapshot_id, dataset=dataset),
            PRMTrainer,
            {"model": model, "args": config, "train_dataset": examples, "output_dir": output_dir},
            one_process=self.one_process,
        )


def snapshot_steps(
    db: Database, ref: str | int, *, targets: str = "hard", until_first_error: bool = False, split: str = TRAIN
) -> list[StepExample]:
    """The step-label PRM's examples: one split of a snapshot, read as the stepwise-supervision
    export writes it (cut at each trajectory's first dead prefix with ``until_first_error``)."""
    rows = snapshot_records(db, ref)[split]
    if until_first_error:
        rows = until_first_dead(rows, lambda r: (r["trajectory_id"], r["chunk_index"], r["q_before"]))
    return examples_from_rows(rows, targets)


def set_outcomes(db: Database, set_name: str, keep: OutcomeFilter | None = None) -> list[OutcomeExample]:
    """The outcome PRM's examples: every graded solution of a set (its trajectories and kept
    rollouts) that ``keep`` keeps (by default: those with a parseable answer)."""
    return [
        OutcomeExample(r["prompt"], tuple(r["steps"]), bool(r["outcome"]))
        for r in outcome_records(db, set_name, keep=keep or OutcomeFilter())
        if r["steps"]
    ]
