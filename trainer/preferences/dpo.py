"""Step-wise DPO on step preference pairs with TRL's ``DPOTrainer``, recorded like GRPO.

Each pair is (prompt = the policy prompt + the steps so far, chosen next step, rejected next step).
The model is passed to TRL by its path, so TRL builds the frozen reference model from the
same weights (with an in-memory model it would need an explicit ``ref_model``); a resumed
run reloads the policy from its checkpoint while the reference stays the base model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stepq.models import Database
from stepq.models.errors import ConfigError
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.runs import RunSpec, TrainOptions, TrainResult, recorded_trl_run

FIELDS = ("prompt", "chosen", "rejected")


def load_preferences(folder: Path) -> list[dict[str, str]]:
    """A ``stepq export preferences`` folder (``train.jsonl`` or ``train.parquet``)."""
    jsonl, parquet = folder / "train.jsonl", folder / "train.parquet"
    rows: list[dict[str, Any]]
    if jsonl.exists():
        rows = []
        for n, line in enumerate(jsonl.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{jsonl}:{n}: not JSON ({exc.msg})") from None
    elif parquet.exists():
        import pyarrow.parquet as pq

        rows = pq.read_table(parquet).to_pylist()
    else:
        raise ConfigError(f"{folder} holds no train.jsonl or train.parquet (write one with 'stepq export preferences')")
    for n, r in enumerate(rows, 1):
        if not all(isinstance(r.get(k), str) for k in FIELDS):
            raise ConfigError(f"{folder}: pair {n} lacks one of {', '.join(FIELDS)}")
    return [{k: r[k] for k in FIELDS} for r in rows]


def train_dpo(
    db: Database,
    pairs: Sequence[dict[str, str]],
    dataset: str,
    recipe: Recipe,
    output_dir: Path,
    options: TrainOptions | None = None,
    on_step: Callable[[], None] | None = None,
) -> TrainResult:
    """Train (or resume, or report as done) the DPO run writing to ``output_dir``."""
    options = options or TrainOptions()
    recipe.expect("dpo")
    if not pairs:
        raise ConfigError(f"{dataset} has no preference pairs to train on")
    output_dir = output_dir.resolve()
    base_model = options.base_model or recipe.model
    spec = RunSpec("dpo", recipe.text, base_model, output_dir, dataset=dataset)
    from trl import DPOConfig

    # built before the run row: a setting this machine cannot honour leaves no row behind
    config = recipe.config(DPOConfig, output_dir, **(options.trainer_overrides or {}))

    from datasets import Dataset
    from trl import DPOTrainer

    data = Dataset.from_list(list(pairs))
    return recorded_trl_run(
        db,
        spec,
        options,
        lambda recorder: DPOTrainer(model=base_model, args=config, train_dataset=data, callbacks=[recorder]),
        on_step=on_step,
        max_steps=int(config.max_steps or 0),
    )
