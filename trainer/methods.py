"""The training methods side by side: which data each trains on, its shipped recipe, where its
run writes by default, and the entry point that trains it.

``stepq train`` parses options into a ``TrainingData`` and calls ``train``; the trainer
service and the benchmarks call the same.  GRPO trains the generative judge on a snapshot;
DPO trains on step preference pairs (Q-derived from a set, chosen by a step search, or an
export); the PRM on outcome-labelled solutions (from a set, or an export).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepq.models import Database
from stepq.models.errors import ConfigError
from stepq.trainer.outcomes.export import OutcomeFilter
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.runs import TrainOptions, TrainResult

DEFAULT_RECIPES = {"grpo": "stepwiser-judge.yaml", "dpo": "step-dpo.yaml", "prm": "outcome-prm.yaml"}
"""Each method's shipped recipe (``trainer/recipes/``)."""


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
    return Path("runs") / (data.source() if method == "grpo" else f"{method}-{data.source()}")


def train(
    db: Database, method: str, recipe: Recipe, data: TrainingData, output: Path | None, options: TrainOptions
) -> TrainResult:
    """Train (or resume, or report a finished) run of ``method`` on ``data``."""
    if method == "grpo":
        if data.snapshot is None:
            raise ConfigError("--method grpo trains on a snapshot: give --snapshot N")
        from stepq.trainer.training.grpo import train_judge

        return train_judge(db, data.snapshot, recipe, output or default_output(method, data), options)
    records, dataset = signal_data(db, method, data)  # checks the data first: its errors say what is missing
    out = output or default_output(method, data)
    if method == "dpo":
        from stepq.trainer.preferences.dpo import train_dpo

        return train_dpo(db, records, dataset, recipe, out, options)
    from stepq.trainer.prm.train import train_prm

    return train_prm(db, records, dataset, recipe, out, options)


def signal_data(db: Database, method: str, data: TrainingData) -> tuple[Any, str]:
    """The pairs (dpo) or outcome examples (prm) and the run's ``dataset`` name."""
    if data.search is not None:
        if method != "dpo" or data.set_name is not None or data.data_dir is not None:
            raise ConfigError("--search gives DPO pairs: use it with --method dpo, without --set or --data")
        from stepq.trainer.preferences.export import search_preference_records

        pairs = search_preference_records(db, data.search)
        if not pairs:
            raise ConfigError(f"step search '{data.search}' has no pairs yet (see 'stepq search status')")
        return pairs, f"preferences:search:{data.search}"
    if (data.set_name is None) == (data.data_dir is None):
        raise ConfigError(f"--method {method} needs exactly one of --set NAME and --data DIR")
    if method == "dpo":
        from stepq.trainer.preferences.dpo import load_preferences
        from stepq.trainer.preferences.export import preference_records

        if data.data_dir is not None:
            return load_preferences(data.data_dir), f"preferences:{data.data_dir.resolve()}"
        assert data.set_name is not None
        return preference_records(db, data.set_name, data.margin), f"preferences:{data.set_name}:margin={data.margin}"
    from stepq.trainer.prm.train import load_outcomes, set_outcomes

    if data.data_dir is not None:
        if data.outcomes != OutcomeFilter():
            raise ConfigError(
                "--pass-rate, --keep-unparseable and --prefix-rollouts apply to --set "
                "(filter an export as it is written)"
            )
        return load_outcomes(data.data_dir), f"outcomes:{data.data_dir.resolve()}"
    assert data.set_name is not None
    return set_outcomes(db, data.set_name, data.outcomes), f"outcomes:{data.set_name}{data.outcomes.describe()}"
