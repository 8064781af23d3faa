"""How training is launched on a node: the shipped accelerate configs (DDP, ZeRO-2/3), the
torchrun command the trainer service runs, and TRL's vLLM modes (the config accepted, the
server mode's command lines).  What needs GPUs and vLLM is not run here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from stepq.cli import main
from stepq.models.errors import ConfigError
from stepq.trainer.training.launch import launch_plan, train_command
from stepq.trainer.training.ranks import current_rank
from stepq.trainer.training.recipe import RECIPES, Recipe

pytestmark = pytest.mark.unit


def test_ranks_come_from_the_launchers_environment() -> None:
    assert current_rank({}).is_main and not current_rank({}).distributed
    follower = current_rank({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"})
    assert (follower.rank, follower.world_size, follower.is_main, follower.distributed) == (3, 8, False, True)


def test_shipped_accelerate_configs() -> None:
    configs = {p.stem: yaml.safe_load(p.read_text()) for p in (RECIPES / "accelerate").glob("*.yaml")}
    assert set(configs) == {"ddp", "zero2", "zero3"}
    assert configs["ddp"]["distributed_type"] == "MULTI_GPU"
    for stage in (2, 3):
        cfg = configs[f"zero{stage}"]
        assert cfg["distributed_type"] == "DEEPSPEED" and cfg["deepspeed_config"]["zero_stage"] == stage
    for cfg in configs.values():
        assert cfg["num_processes"] == 8 and cfg["num_machines"] == 1 and cfg["use_cpu"] is False


def test_train_command() -> None:
    assert train_command(1, ["--snapshot", "1"], "py") == ["py", "-m", "stepq", "train", "--snapshot", "1"]
    multi = train_command(4, ["--snapshot", "1"], "py")
    assert multi[:6] == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4"]
    assert multi[6:] == ["-m", "stepq", "train", "--snapshot", "1"]
    with pytest.raises(ConfigError):
        train_command(0, [])


def test_vllm_modes(tmp_path: Path) -> None:
    from trl import GRPOConfig

    shipped = Recipe.load("stepwiser-judge.yaml")
    plain = launch_plan(shipped, 8, ["--snapshot", "1"])
    assert plain.server is None and plain.train_gpus == tuple(range(8)) and "8" in plain.train
    colocate = shipped.with_options(["trainer.use_vllm=true", "trainer.bf16=false"])
    assert colocate.config(GRPOConfig, tmp_path).vllm_mode == "colocate"  # TRL accepts it as shipped
    server = shipped.with_options(
        ["trainer.use_vllm=true", "trainer.vllm_mode=server", "trainer.vllm_server_port=8011", "trainer.bf16=false"]
    )
    config = server.config(GRPOConfig, tmp_path)
    assert (config.use_vllm, config.vllm_mode, config.vllm_server_port) == (True, "server", 8011)
    plan = launch_plan(server, 8, ["--snapshot", "1"], server_gpus=2)
    assert plan.server == [
        *("trl", "vllm-serve", "--model", shipped.model, "--tensor-parallel-size", "2"),
        *("--port", "8011", "--gpu-memory-utilization", "0.3"),
    ]
    assert plan.server_gpus == (6, 7) and plan.train_gpus == tuple(range(6))
    assert plan.train[plan.train.index("--nproc_per_node") + 1] == "6"
    lines = plan.shell()
    assert lines[0].startswith("CUDA_VISIBLE_DEVICES=6,7 trl vllm-serve") and lines[0].endswith("&")
    assert lines[1].startswith("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5 python -m torch.distributed.run")
    with pytest.raises(ConfigError):
        launch_plan(server, 2, [], server_gpus=2)  # nothing left to train on
    with pytest.raises(ConfigError):
        launch_plan(shipped, 8, [], server_gpus=2)  # not a server-mode recipe


def test_the_docs_plan_command_runs_as_written() -> None:
    """docs/training.md's server-mode example, word for word."""
    docs = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    start = docs.index("stepq train plan --gpus 8")
    command = docs[start : docs.index("\n#", start)].replace("\\\n", " ").split()
    result = CliRunner().invoke(main, command[1:])
    assert result.exit_code == 0, result.output
    server, trainer = result.output.strip().splitlines()
    assert server.startswith("CUDA_VISIBLE_DEVICES=6,7 trl vllm-serve --model Qwen/Qwen2.5-1.5B-Instruct")
    assert "--recipe-option trainer.vllm_mode=server" in trainer and "--nproc_per_node 6" in trainer


def test_train_plan_command(tmp_path: Path) -> None:
    recipe = tmp_path / "server.yaml"
    data = yaml.safe_load((RECIPES / "stepwiser-judge.yaml").read_text())
    data["trainer"].update(use_vllm=True, vllm_mode="server", vllm_tensor_parallel_size=2)
    recipe.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(main, ["train", "plan", "--recipe", str(recipe), "--gpus", "8", "--snapshot", "3"])
    assert result.exit_code == 0, result.output
    server, trainer = result.output.strip().splitlines()
    assert (
        "trl vllm-serve" in server
        and "--tensor-parallel-size 2" in server
        and server.startswith("CUDA_VISIBLE_DEVICES=6,7 ")
    )
    assert "--nproc_per_node 6" in trainer and "--snapshot 3" in trainer and "runs/snapshot-3" in trainer
