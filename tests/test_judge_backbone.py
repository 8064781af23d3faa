"""A judge's backbone built to its drill floor and recorded: further rounds while below it, a
refusal (and no folder left) when the rounds run out, and a reused folder checked against its
record (weights and recipe).  Tiny sizes: a 1-layer model a few steps, which computes no drill."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bench.experiments.judge_backbone import RECORD, BackboneRecipe, BackboneRefused, built_backbone

TINY = BackboneRecipe(seed=0, layers=1, width=64, problems=10, steps=2, numbers="small", batch=2, drills=10)


def test_a_floor_is_named_in_the_folder_and_needs_drills() -> None:
    assert TINY.folder_name() == "seed0-layers1-drills"
    assert replace(TINY, drill_floor=80).folder_name() == "seed0-layers1-drills-floor80"
    assert replace(TINY, drills=0).folder_name() == "seed0-layers1"


def test_a_floor_without_drills_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BackboneRefused, match="needs drills"):
        built_backbone(tmp_path / "b", replace(TINY, drills=0, drill_floor=50))
    assert not (tmp_path / "b").exists()


def test_a_build_is_recorded_and_a_changed_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "b"
    record = built_backbone(path, TINY)
    assert record["steps"] == TINY.steps and len(record["drills"]) == 1, "no floor: the first round is kept"
    assert json.loads((path / RECORD).read_text())["weights_sha256"] == record["weights_sha256"]
    assert record["recipe"]["threads"] == 1 and torch.__version__ in record["libraries"].values()
    assert built_backbone(path, TINY) == json.loads((path / RECORD).read_text()), "reused, not built again"
    with pytest.raises(BackboneRefused, match=r"another recipe .*steps"):
        built_backbone(path, replace(TINY, steps=3))
    weights = load_file(path / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1e-3
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BackboneRefused, match="do not match their record"):
        built_backbone(path, TINY)


def test_a_build_below_its_floor_trains_on_then_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "b"
    recipe = replace(TINY, drill_floor=100.0, round_steps=1, max_rounds=2)
    with pytest.raises(BackboneRefused, match=r"after 4 steps \(2 further rounds\), below the floor 100%"):
        built_backbone(path, recipe)
    assert capsys.readouterr().out.count("below the floor") == 2, "one more round each time it fell short"
    assert not path.exists(), "a refused build leaves nothing a later run would take"


def test_a_build_runs_on_its_own_thread_count_and_builds_the_same_weights_again(tmp_path: Path) -> None:
    """The build sets the recipe's thread count, whatever the caller's, and gives it back
    afterwards; two builds of one recipe hash the same here, another seed's do not."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        first = built_backbone(tmp_path / "a", TINY)
        assert first["torch_threads"] == TINY.threads == 1 and torch.get_num_threads() == 2
        second = built_backbone(tmp_path / "b", replace(TINY, threads=2))
        assert second["torch_threads"] == 2
    finally:
        torch.set_num_threads(before)
    again = built_backbone(tmp_path / "c", TINY)
    assert again["weights_sha256"] == first["weights_sha256"], "one recipe, one machine: the same weights"
    other = built_backbone(tmp_path / "d", replace(TINY, seed=1))
    assert other["weights_sha256"] != first["weights_sha256"], "the hash tells builds apart"
