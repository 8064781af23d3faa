"""The one next-token training loop of the experiments (pretraining a backbone, teaching a
verdict, building a neural policy), on PyTorch and transformers alone, so it runs the same on 2
CPU cores and on one GPU in bf16 (``judge_gpu.py`` carries nothing else)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Device:
    """Where the tensors live; ``bf16``: autocast the matrix work to bfloat16 (CUDA)."""

    name: str = "cpu"
    bf16: bool = False

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        import torch

        if self.bf16:
            return torch.autocast(device_type=self.name.split(":")[0], dtype=torch.bfloat16)
        return contextlib.nullcontext()


CPU = Device()
SCHEDULES = ("warmup", "linear-decay")
"""warmup: the rate rises over the first 100 steps, then stays; linear-decay: from the full
rate down to 0 at the last step."""


def fit_causal_lm(
    model_dir: Path | str,
    encoded: Sequence[tuple[list[int], int]],
    steps: int,
    batch_size: int,
    seed: int,
    *,
    lr: float = 1e-3,
    schedule: str = "warmup",
    weight_decay: float = 0.0,
    group: int = 1,
    device: Device | None = None,
    pad_id: int | None = None,
    keep_at: Mapping[int, Callable[[Any, Any], None]] | None = None,
    check_every: int = 0,
    on_check: Callable[[int, Any, Any], bool] | None = None,
    log_every: int = 250,
) -> float:
    """Next-token training of the model saved in ``model_dir`` (saved back there) on token ids,
    the loss from each example's ``start`` on (a prompt's tokens are not predicted); AdamW,
    gradients clipped at 1.  Returns the last step's loss.

    ``group`` > 1: a batch is made of whole runs of ``group`` consecutive examples (one prompt
    with each verdict, so no batch pushes one over the other).  ``device`` None: CUDA when there
    is one.  ``pad_id`` None: the tokenizer's (padding is masked: any id trains the same).
    ``keep_at`` maps a step count to a function given the model and tokenizer as they are after
    that many steps: the weights a run of exactly that many steps ends with.
    ``on_check`` is called every ``check_every`` steps with the step count, the model (in eval
    mode: no dropout) and the tokenizer; it returns True to end the run there.  It must not draw
    from torch's random generator (greedy decoding does not), so checking leaves the run's
    weights as they would be without it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r} is not one of {SCHEDULES}")
    if device is None:
        device = Device("cuda") if torch.cuda.is_available() else CPU
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device.name)
    pad = tokenizer.pad_token_id if pad_id is None else pad_id
    torch.manual_seed(seed)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    if schedule == "warmup":
        rate: Callable[[int], float] = lambda i: min(1.0, (i + 1) / 100)  # noqa: E731
    else:
        rate = lambda i: 1.0 - i / steps  # noqa: E731
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    model.train()
    loss_value = float("nan")
    for step in range(steps):
        starts = [group * rng.randrange(len(encoded) // group) for _ in range(batch_size // group)]
        batch = [encoded[s + k] for s in starts for k in range(group)]
        width = max(len(example[0]) for example in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (row, start) in enumerate(batch):
            ids[i, : len(row)] = torch.tensor(row)
            labels[i, start : len(row)] = torch.tensor(row[start:])
            mask[i, : len(row)] = 1
        with device.autocast():
            out = model(
                input_ids=ids.to(device.name), attention_mask=mask.to(device.name), labels=labels.to(device.name)
            )
        loss = out.loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = float(loss.item())
        if keep_at and step + 1 in keep_at and step + 1 < steps:
            keep_at[step + 1](model, tokenizer)
        if log_every and ((step + 1) % log_every == 0 or step == steps - 1):
            print(f"    step {step + 1}/{steps}: loss {loss_value:.4f}", flush=True)
        if on_check is not None and check_every and (step + 1) % check_every == 0:
            model.eval()
            stop = on_check(step + 1, model, tokenizer)
            model.train()
            if stop:
                break
    model.to("cpu").save_pretrained(model_dir)
    return loss_value
