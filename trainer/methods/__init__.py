"""The training methods side by side, and the one registry every trainer goes through:
``stepq train``, the trainer service, the API and the benchmarks.

A method is one module (a ``base.Method`` whose ``plan`` describes its run) and one line
here; a method in a package of its own registers itself under the ``stepq.methods`` entry
point group instead (``name = "module:Class"``), and ``stepq train --method name`` finds it.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

from stepq.models import Database
from stepq.models.errors import ConfigError
from stepq.trainer.methods.base import Method, TrainingData
from stepq.trainer.methods.dpo import DPO
from stepq.trainer.methods.grpo import GRPO
from stepq.trainer.methods.prm import PRM
from stepq.trainer.methods.sft import SFT
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.runs import TrainOptions, TrainResult, execute

__all__ = ["REGISTRY", "Method", "TrainingData", "method_named", "names", "recipe_for", "train"]

REGISTRY: dict[str, Method] = {m.name: m for m in (GRPO(), DPO(), PRM(), SFT())}
"""The built-in methods, by the name recipes and ``stepq train --method`` use."""
ENTRY_POINTS = "stepq.methods"


def _installed() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINTS) if ep.name not in REGISTRY}


def names() -> list[str]:
    """Every method's name, built-in and installed (no installed method is imported)."""
    return [*REGISTRY, *sorted(_installed())]


def method_named(name: str) -> Method:
    if name in REGISTRY:
        return REGISTRY[name]
    installed = _installed().get(name)
    if installed is None:
        raise ConfigError(f"unknown training method '{name}' (one of: {', '.join(names())})")
    loaded = installed.load()  # type: ignore[attr-defined]
    method = loaded() if isinstance(loaded, type) else loaded
    if not isinstance(method, Method) or method.name != name:
        raise ConfigError(f"the '{name}' entry point in {ENTRY_POINTS} is not a stepq Method named '{name}'")
    return method


def recipe_for(
    method: str | None, recipe: str | None, options: tuple[str, ...] = (), model: str | None = None
) -> Recipe:
    """The recipe to train with (the method's shipped one unless named), overridden by
    ``options`` and ``model``, and checked to be for ``method``."""
    shipped = method_named(method or "grpo").recipe
    loaded = Recipe.load(recipe or shipped).with_options(options, model=model)
    method_named(loaded.method)  # a recipe naming no known method fails here, by name
    loaded.expect(method or loaded.method)
    return loaded


def train(
    db: Database, method: str | Method, recipe: Recipe, data: TrainingData, output: Path | None, options: TrainOptions
) -> TrainResult:
    """Train (or resume, or report a finished) run of ``method`` on ``data``: the method
    describes the run, ``runs.execute`` carries it out.  ``method``: a registered name, or a
    script's own ``Method`` (trained and recorded the same way, never registered)."""
    chosen = method if isinstance(method, Method) else method_named(method)
    recipe.expect(chosen.name)
    if not data.given():
        raise ConfigError(f"no training data given to --method {chosen.name} ({chosen.summary})")
    output_dir = (output or chosen.default_output(data)).resolve()
    return execute(db, chosen.plan(db, recipe, data, output_dir, options), options)
