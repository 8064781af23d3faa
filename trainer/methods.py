"""The training methods side by side: which data each trains on, its shipped recipe, where its
run writes by default, and the entry point that trains it.

``stepq train`` parses options into a ``TrainingData`` and calls ``train``; the trainer
service and the benchmarks call the same.  GRPO trains the generative judge on a snapshot;
DPO trains on step preference pairs (Q-derived from a set, chosen by a step search, or an
export); the PRM on outcome-labelled solutions (from a set, or an export).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stepq.models import Database
from stepq.models.errors import ConfigError
from stepq.trainer.outcomes.export import OutcomeFilter
from stepq.trainer.training.recipe import METHODS, Recipe
from stepq.trainer.training.runs import TrainOptions, TrainResult


@dataclass(frozen=True)
class TrainingData:
    """What a run trains on: a snapshot (grpo), or for dpo/prm exactly one of a set, a step
    search (dpo) and an exported folder."""

    snapshot: str | None = None
    set_name: str | None = None
    search: str | None = None
    data_dir: Path | None = None
    margin: float = 0.3
    """dpo from a set: the least Q difference of a step pair."""
    until_first_error: bool = False
    """prm on a snapshot: each trajectory's labelled steps up to its first dead prefix."""
    outcomes: OutcomeFilter = field(default_factory=OutcomeFilter)
    """prm from a set: which solutions to keep."""

    def source(self) -> str:
        """A short name of the data, for the default output folder."""
        if self.snapshot is not None:
            return f"snapshot-{self.snapshot}"
        named = self.search or self.set_name or (self.data_dir.name if self.data_dir else None)
        if named is None:
            raise ConfigError("no training data given: a snapshot, a set, a step search or a folder")
        return named


@dataclass(frozen=True)
class Method:
    """One training method: the recipe it ships, where its runs write by default, and the
    entry point that checks its data and trains (each imports its trainer lazily: TRL is not
    needed to list the methods)."""

    name: str
    recipe: str
    """The shipped recipe (``trainer/recipes/``)."""
    trains: Callable[[Database, Recipe, TrainingData, Path | None, TrainOptions], TrainResult]
    judge_runs_folder: bool = False
    """Its runs write to ``runs/<data>`` (the judge's ``runs/snapshot-N``), not ``runs/<method>-<data>``."""

    def default_output(self, data: TrainingData) -> Path:
        return Path("runs") / (data.source() if self.judge_runs_folder else f"{self.name}-{data.source()}")


def _train_grpo(
    db: Database, recipe: Recipe, data: TrainingData, output: Path | None, options: TrainOptions
) -> TrainResult:
    """The generative judge, by GRPO on a balanced snapshot."""
    if data.snapshot is None:
        raise ConfigError("--method grpo trains on a snapshot: give --snapshot N")
    from stepq.trainer.training.grpo import train_judge

    return train_judge(db, data.snapshot, recipe, output or GRPO.default_output(data), options)


def _train_dpo(
    db: Database, recipe: Recipe, data: TrainingData, output: Path | None, options: TrainOptions
) -> TrainResult:
    """Step-wise DPO on step preference pairs: Q-derived from a set, chosen by a step search,
    or an export."""
    from stepq.trainer.preferences.dpo import load_preferences, train_dpo
    from stepq.trainer.preferences.export import preference_records, search_preference_records

    if data.search is not None:
        if data.set_name is not None or data.data_dir is not None:
            raise ConfigError("--search gives DPO pairs: use it with --method dpo, without --set or --data")
        pairs = search_preference_records(db, data.search)
        if not pairs:
            raise ConfigError(f"step search '{data.search}' has no pairs yet (see 'stepq search status')")
        records, dataset = pairs, f"preferences:search:{data.search}"
    elif data.data_dir is not None and data.set_name is None:
        records, dataset = load_preferences(data.data_dir), f"preferences:{data.data_dir.resolve()}"
    elif data.set_name is not None and data.data_dir is None:
        records = preference_records(db, data.set_name, data.margin)
        dataset = f"preferences:{data.set_name}:margin={data.margin}"
    else:
        raise ConfigError("--method dpo needs exactly one of --set NAME and --data DIR")
    return train_dpo(db, records, dataset, recipe, output or DPO.default_output(data), options)


def _train_prm(
    db: Database, recipe: Recipe, data: TrainingData, output: Path | None, options: TrainOptions
) -> TrainResult:
    """The discriminative PRM: on a snapshot's step labels (the step-label PRM), or on
    outcome-labelled solutions (from a set, or an export)."""
    from stepq.trainer.prm.train import PRMConfig, load_outcomes, set_outcomes, train_prm

    if data.search is not None:
        raise ConfigError("--search gives DPO pairs: use it with --method dpo, without --set or --data")
    if data.snapshot is not None:
        from stepq.trainer.prm.step_labels import snapshot_steps

        if data.set_name is not None or data.data_dir is not None:
            raise ConfigError("--method prm trains on one of --snapshot N (step labels), --set NAME or --data DIR")
        targets = recipe.config(PRMConfig, **(options.trainer_overrides or {})).step_targets
        steps = snapshot_steps(db, data.snapshot, targets=targets, until_first_error=data.until_first_error)
        cut = ":until-first-error" if data.until_first_error else ""
        dataset = f"steps:snapshot-{data.snapshot}:{targets}{cut}"
        return train_prm(db, steps, dataset, recipe, output or PRM.default_output(data), options)
    if data.until_first_error:
        raise ConfigError("--until-first-error applies to step labels: use it with --snapshot")
    if data.data_dir is not None and data.set_name is None:
        if data.outcomes != OutcomeFilter():
            raise ConfigError(
                "--pass-rate, --keep-unparseable and --prefix-rollouts apply to --set "
                "(filter an export as it is written)"
            )
        records, dataset = load_outcomes(data.data_dir), f"outcomes:{data.data_dir.resolve()}"
    elif data.set_name is not None and data.data_dir is None:
        records = set_outcomes(db, data.set_name, data.outcomes)
        dataset = f"outcomes:{data.set_name}{data.outcomes.describe()}"
    else:
        raise ConfigError("--method prm needs one of --snapshot N (step labels), --set NAME and --data DIR (outcomes)")
    return train_prm(db, records, dataset, recipe, output or PRM.default_output(data), options)


GRPO = Method("grpo", "stepwiser-judge.yaml", _train_grpo, judge_runs_folder=True)
DPO = Method("dpo", "step-dpo.yaml", _train_dpo)
PRM = Method("prm", "outcome-prm.yaml", _train_prm)
REGISTRY: dict[str, Method] = {m.name: m for m in (GRPO, DPO, PRM)}
"""Every method, by the name recipes and ``stepq train --method`` use (``recipe.METHODS``)."""
assert set(REGISTRY) == set(METHODS), "a method without an entry point, or an entry point without a name"
DEFAULT_RECIPES = {name: m.recipe for name, m in REGISTRY.items()}
"""Each method's shipped recipe (``trainer/recipes/``)."""


def method_named(name: str) -> Method:
    if name not in REGISTRY:
        raise ConfigError(f"unknown training method '{name}' (one of: {', '.join(REGISTRY)})")
    return REGISTRY[name]


def recipe_for(
    method: str | None, recipe: str | None, options: tuple[str, ...] = (), model: str | None = None
) -> Recipe:
    """The recipe to train with (the method's shipped one unless named), overridden by
    ``options`` and ``model``, and checked to be for ``method``."""
    loaded = Recipe.load(recipe or DEFAULT_RECIPES[method or "grpo"]).with_options(options, model=model)
    loaded.expect(method or loaded.method)
    return loaded


def default_output(method: str, data: TrainingData) -> Path:
    """``runs/snapshot-N`` for a judge, ``runs/<method>-<data>`` for the other signals."""
    return method_named(method).default_output(data)


def train(
    db: Database, method: str, recipe: Recipe, data: TrainingData, output: Path | None, options: TrainOptions
) -> TrainResult:
    """Train (or resume, or report a finished) run of ``method`` on ``data``."""
    return method_named(method).trains(db, recipe, data, output, options)
