"""What every training method is: a name, its shipped recipe, and ``plan``, which loads the
method's data and describes its run (``runs.RunPlan``) without running anything.

The executor (``training/runs.execute``) carries every plan out the same way, so a method
holds only what is its own: which data it reads, its config, its trainer and that trainer's
arguments, and the files it keeps beside the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.trainer.outcomes.export import OutcomeFilter
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.runs import RunPlan, TrainOptions


@dataclass(frozen=True)
class TrainingData:
    """What a run trains on: a snapshot, a set, a step search, an exported folder, or records
    given in memory (a script's or a benchmark's), named by ``name`` on the run row.  Which of
    them a method accepts is the method's to say."""

    snapshot: str | None = None
    set_name: str | None = None
    search: str | None = None
    data_dir: Path | None = None
    records: Sequence[Any] | None = None
    """The method's own examples, already built (the PRM's ``OutcomeExample``/``StepExample``,
    DPO's pair dicts)."""
    name: str | None = None
    """``records``' name: the run row's dataset."""
    margin: float = 0.3
    """dpo from a set: the least Q difference of a step pair."""
    until_first_error: bool = False
    """On a snapshot: each trajectory's labelled steps up to its first dead prefix."""
    outcomes: OutcomeFilter = field(default_factory=OutcomeFilter)
    """prm from a set: which solutions to keep."""

    def source(self) -> str:
        """A short name of the data, for the default output folder."""
        if self.snapshot is not None:
            return f"snapshot-{self.snapshot}"
        named = self.search or self.set_name or (self.data_dir.name if self.data_dir else None) or self.name
        if named is None:
            raise ConfigError("no training data given: a snapshot, a set, a step search or a folder")
        return named

    def given(self) -> set[str]:
        """Which sources were given (by their option names)."""
        sources = {
            "--snapshot": self.snapshot,
            "--set": self.set_name,
            "--search": self.search,
            "--data": self.data_dir,
            "records": self.records,
        }
        return {option for option, value in sources.items() if value is not None}

    def only(self, method: str, *allowed: str) -> str:
        """The one source given, which must be among ``allowed``."""
        given = self.given()
        if len(given) != 1 or not given <= set(allowed):
            options = [a for a in allowed if a != "records"]
            named = options[0] if len(options) == 1 else "exactly one of " + " or ".join(options)
            raise ConfigError(f"--method {method} trains on {named}")
        return next(iter(given))

    def snapshot_id(self, db: Database) -> int:
        """The snapshot's row id, looked up once for the whole run."""
        assert self.snapshot is not None
        with db.session() as session:
            return queries.get_snapshot(session, self.snapshot).id


class Method:
    """One training method.  A subclass sets the class attributes and writes ``plan``;
    registering it is one line (``methods.REGISTRY``, or the ``stepq.methods`` entry point
    group for a method in a package of its own)."""

    name: str = ""
    recipe: str = ""
    """The shipped recipe (a name under ``trainer/recipes/``, or a path)."""
    summary: str = ""
    """One line for ``stepq train --help``."""
    trains_on_snapshots: bool = False
    """It can train on a snapshot, so the trainer service can train a lineage with it."""
    one_process: bool = False
    """Its trainer runs in one process (not under torchrun or accelerate launch)."""
    judge_runs_folder: bool = False
    """Its runs write to ``runs/<data>`` (the judge's ``runs/snapshot-N``), not ``runs/<method>-<data>``."""

    def plan(
        self, db: Database, recipe: Recipe, data: TrainingData, output_dir: Path, options: TrainOptions
    ) -> RunPlan:
        """Load the data and describe the run writing to ``output_dir`` (resolved).  Build the
        config here: a setting this machine cannot honour fails before a run row exists."""
        raise NotImplementedError

    def default_output(self, data: TrainingData) -> Path:
        return Path("runs") / (data.source() if self.judge_runs_folder else f"{self.name}-{data.source()}")


def base_model(recipe: Recipe, options: TrainOptions) -> str:
    """The model a run starts from: the service's (continuing its lineage), else the recipe's."""
    return options.base_model or recipe.model
