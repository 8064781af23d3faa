"""How a training run is started on one node: the multi-process launch of ``stepq train``
and, for GRPO with TRL's vLLM server mode, the generation server beside it.

TRL's vLLM integration has two modes.  ``colocate``: every training rank runs its own vLLM
engine on its own GPU (no extra process; ``vllm_gpu_memory_utilization`` shares the card).
``server``: some GPUs run ``trl vllm-serve`` and the training ranks send it their prompts
and their new weights.  ``launch_plan`` turns a recipe and a GPU count into the exact
commands, so an operator does not split the GPUs by hand.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from stepq.models.errors import ConfigError
from stepq.trainer.training.recipe import Recipe


@dataclass(frozen=True)
class LaunchPlan:
    train: list[str]
    """The training command (run with ``CUDA_VISIBLE_DEVICES`` = ``train_gpus``)."""
    train_gpus: tuple[int, ...]
    server: list[str] | None = None
    """``trl vllm-serve`` for server mode (``CUDA_VISIBLE_DEVICES`` = ``server_gpus``)."""
    server_gpus: tuple[int, ...] = ()

    def shell(self) -> list[str]:
        """The plan as shell lines, the server first (the trainer waits for it)."""
        lines = []
        if self.server is not None:
            devices = ",".join(map(str, self.server_gpus))
            lines.append(f"CUDA_VISIBLE_DEVICES={devices} {shlex.join(self.server)} &")
        devices = ",".join(map(str, self.train_gpus))
        lines.append(f"CUDA_VISIBLE_DEVICES={devices} {shlex.join(self.train)}")
        return lines


def train_command(processes: int, stepq_args: Sequence[str], python: str = sys.executable) -> list[str]:
    """``stepq train ARGS`` on ``processes`` ranks of this node (torchrun's standalone
    rendezvous, so two launches on one node do not collide on a port); one process is a
    plain ``python -m stepq``."""
    if processes < 1:
        raise ConfigError(f"a training launch needs at least one process, got {processes}")
    if processes == 1:
        return [python, "-m", "stepq", "train", *stepq_args]
    launcher = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    return [*launcher, "-m", "stepq", "train", *stepq_args]


def launch_plan(recipe: Recipe, gpus: int, stepq_args: Sequence[str], server_gpus: int = 0) -> LaunchPlan:
    """The commands that train ``recipe`` on ``gpus`` GPUs of one node.

    With ``use_vllm: true`` and ``vllm_mode: server`` the last ``server_gpus`` GPUs (default:
    the recipe's ``vllm_tensor_parallel_size``, at least 1) serve generation and the rest
    train; the server gets the recipe's model and the host and port the trainer will call.
    """
    trainer = recipe.trainer
    mode = str(trainer.get("vllm_mode", "colocate")) if trainer.get("use_vllm") else None
    if mode not in (None, "colocate", "server"):
        raise ConfigError(f"recipe: trainer.vllm_mode must be 'colocate' or 'server', not {mode!r}")
    if mode != "server":
        if server_gpus:
            raise ConfigError("--server-gpus needs a recipe with use_vllm: true and vllm_mode: server")
        return LaunchPlan(train_command(gpus, stepq_args, "python"), tuple(range(gpus)))
    serve = server_gpus or int(trainer.get("vllm_tensor_parallel_size", 1) or 1)
    if gpus - serve < 1:
        raise ConfigError(f"{gpus} GPU(s) leave none to train on beside {serve} for the vLLM server")
    server = ["trl", "vllm-serve", "--model", recipe.model, "--tensor-parallel-size", str(serve)]
    server += ["--port", str(trainer.get("vllm_server_port", 8000))]
    if trainer.get("vllm_gpu_memory_utilization") is not None:
        server += ["--gpu-memory-utilization", str(trainer["vllm_gpu_memory_utilization"])]
    if trainer.get("vllm_max_model_length") is not None:
        server += ["--max-model-len", str(trainer["vllm_max_model_length"])]
    train_gpus = tuple(range(gpus - serve))
    train = train_command(len(train_gpus), stepq_args, "python")
    return LaunchPlan(train, train_gpus, server, tuple(range(gpus - serve, gpus)))
