"""A judge's backbone built to a skill and recorded, so that a run says which weights it used
and a reused folder is the one it claims to be.

The same pretraining command built backbones that compute 93/97/91% of their arithmetic drills
on one processor and 95/97/55% on another (docs/experiments/judge_grpo_log.md): a step count
names no skill, as with the neural policies (``neural_policy.py``).  So a build runs under fixed
numerics (its own thread count, deterministic algorithms) and, with ``drill_floor`` set,
pretrains on in further rounds of ``round_steps`` (the rate decaying from the full rate to 0
again) until its drills reach the floor, refusing a build still below it after ``max_rounds``.
It records the recipe, the steps taken, the drills after each round, the libraries, the
processor and a hash of the weights; reused, the hash and the recipe are checked.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.experiments.judge_capacity import CPU, Device, backbone_texts, drill_accuracy, lm_train, pretrain_backbone
from bench.experiments.neural_policy import fixed_numerics, processor_name, weights_sha256
from stepq.workers.seeds import derive_seed

RECORD = "backbone.json"


class BackboneRefused(Exception):
    """A backbone folder that cannot be used as its recipe's build (changed weights, another
    recipe, a build that never reached its floor)."""


@dataclass(frozen=True)
class BackboneRecipe:
    seed: int
    layers: int
    width: int
    problems: int
    steps: int
    numbers: str
    batch: int = 16
    drills: int = 0
    drill_floor: float = 0.0
    """The share of fresh drills (percent) the build must compute; 0: the first round is kept."""
    round_steps: int = 1000
    max_rounds: int = 3
    threads: int = 1
    """torch's CPU threads during the build, whatever the caller's OMP_NUM_THREADS."""

    def folder_name(self) -> str:
        floor = f"-floor{self.drill_floor:g}" if self.drill_floor else ""
        return f"seed{self.seed}-layers{self.layers}" + ("-drills" if self.drills else "") + floor


def built_backbone(path: Path, recipe: BackboneRecipe, device: Device = CPU) -> dict[str, Any]:
    """The backbone at ``path``, built there by ``recipe`` if absent, verified if present;
    returns its record (None fields where an older build has no record)."""
    if (path / "config.json").exists():
        return verified_backbone(path, recipe)
    if recipe.drill_floor and not recipe.drills:
        raise BackboneRefused("a drill floor needs drills in the pretraining (an analysis in the drills' spelling)")
    import torch

    started = time.perf_counter()
    with fixed_numerics(recipe.threads):
        threads = torch.get_num_threads()  # what the build ran on, to record
        loss = pretrain_backbone(
            path, recipe.seed, layers=recipe.layers, width=recipe.width, problems=recipe.problems,
            steps=recipe.steps, numbers=recipe.numbers, batch=recipe.batch, device=device, drills=recipe.drills,
        )  # fmt: skip
        steps = recipe.steps
        history = [(steps, drill_accuracy(path, recipe.seed, device=device))] if recipe.drills else []
        texts: list[tuple[str, str]] = []
        for more in range(1, recipe.max_rounds + 1):
            if not history or history[-1][1] >= recipe.drill_floor:
                break
            texts = texts or backbone_texts(recipe.seed, recipe.problems, recipe.numbers, recipe.drills)
            print(f"  backbone seed {recipe.seed}: {history[-1][1]:.0f}% of drills after {steps} steps, "
                  f"below the floor {recipe.drill_floor:g}%: {recipe.round_steps} more", flush=True)  # fmt: skip
            seed = derive_seed("judge-backbone-round", recipe.seed, more)
            loss = lm_train(path, texts, recipe.round_steps, recipe.batch, 1e-3, seed, device=device, log_every=1000)
            steps += recipe.round_steps
            history.append((steps, drill_accuracy(path, recipe.seed, device=device)))
    if history and history[-1][1] < recipe.drill_floor:
        shutil.rmtree(path)
        raise BackboneRefused(
            f"backbone seed {recipe.seed} computes {history[-1][1]:.0f}% of its drills after {steps} steps "
            f"({recipe.max_rounds} further rounds), below the floor {recipe.drill_floor:g}%: raise max_rounds "
            "or pretrain longer"
        )
    record = {
        "recipe": asdict(recipe),
        "steps": steps,
        "loss": loss,
        "drills": history,
        "seconds": round(time.perf_counter() - started),
        "weights_sha256": weights_sha256(path),
        "libraries": _libraries(),
        "torch_threads": threads,
        "processor": processor_name(),
        "device": device.name,
    }
    (path / RECORD).write_text(json.dumps(record, indent=1))
    return record


def verified_backbone(path: Path, recipe: BackboneRecipe) -> dict[str, Any]:
    """The record of the backbone kept at ``path``, refused if its weights or recipe are not the
    recorded ones.  A folder built before records were written is taken as it is (its record's
    fields None), as earlier runs took it."""
    digest = weights_sha256(path)
    if not (path / RECORD).exists():
        print(f"  backbone {path.name}: no record (built before records were kept), weights {digest[:12]}")
        return {
            "recipe": None,
            "steps": None,
            "loss": float("nan"),
            "drills": [],
            "weights_sha256": digest,
            "processor": None,
        }
    record: dict[str, Any] = json.loads((path / RECORD).read_text())
    if digest != record["weights_sha256"]:
        raise BackboneRefused(
            f"{path}: the weights do not match their record (sha256 {digest[:16]}..., recorded "
            f"{record['weights_sha256'][:16]}...): delete the folder to build it again"
        )
    if record["recipe"] != asdict(recipe):
        changed = sorted(k for k, v in asdict(recipe).items() if record["recipe"].get(k) != v)
        raise BackboneRefused(f"{path}: built by another recipe (differs in {', '.join(changed)}); use another --keep")
    return record


def _libraries() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    return {m.__name__: m.__version__ for m in (torch, transformers, tokenizers)}
