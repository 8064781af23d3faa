"""Which process of a multi-process launch this is, and what it may do.

``torchrun`` and ``accelerate launch`` start one process per device and tell each its place
in the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``).  Every rank trains (DDP,
DeepSpeed ZeRO); exactly one, rank 0, owns the run's database side: its row, lease,
metrics and checkpoint records.  The others follow: they never create, claim or end a row,
so a 2-process launch is one run, not two processes fighting over one lease.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Rank:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def current_rank(environ: dict[str, str] | None = None) -> Rank:
    """This process's place in the launch (rank 0 of 1 when started plainly)."""
    env = os.environ if environ is None else environ
    try:
        return Rank(int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")))
    except ValueError:
        return Rank()


def die_with_launcher() -> None:
    """Under ``torchrun``/``accelerate launch``, end this rank when its launcher dies.

    The launcher starts the ranks in process groups of their own, so a SIGKILL of the
    launcher (a node's job killed, an operator's ``kill -9``) would leave them training on,
    orphaned, beside the rerun that resumes their run.  Linux's parent-death signal ends
    them with it; elsewhere this does nothing.
    """
    if not current_rank().distributed or not sys.platform.startswith("linux"):
        return
    import ctypes

    launcher = os.getppid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # pragma: no cover - no glibc
        return
    if os.getppid() != launcher:  # it died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sum ``values`` over every rank (a collective: every rank must call it at the same
    point); the identity when the process group is not up."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a training dependency
        return values
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    backend: Any = dist.get_backend()
    if backend == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor)
    return [float(v) for v in tensor.cpu().tolist()]
