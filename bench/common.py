"""Helpers shared by the benchmarks: throwaway databases and JSON output."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from stepq.migrations import upgrade

PG_SERVER = os.environ.get("STEPQ_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("STEPQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/8")


@contextmanager
def scratch_pg() -> Iterator[str]:
    """A migrated PostgreSQL database that is dropped afterwards."""
    admin = create_engine(PG_SERVER, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    name = f"stepq_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_SERVER).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


def emit(result: dict[str, Any]) -> None:
    """Benchmarks print their figures as one JSON object on the last line."""
    print(json.dumps(result, sort_keys=True))


def train_causal_lm(
    model_dir: Any,
    encoded: Sequence[tuple[list[int], int]],
    steps: int,
    batch_size: int,
    seed: int,
    lr: float = 1e-3,
    keep_at: Mapping[int, Callable[[Any, Any], None]] | None = None,
) -> float:
    """Next-token training of the model saved in ``model_dir`` (saved back there), on token
    ids whose loss starts at each example's ``start`` (a prompt's tokens are not predicted);
    warm-up over 100 steps, then a constant rate.  Returns the last step's loss.

    ``keep_at`` maps a step count to a function given the model and tokenizer as they are
    after that many steps: the same weights a run of exactly that many steps ends with, so
    strengths that differ only in steps are built by one run."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir).to(device)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / 100))
    model.train()
    loss_value = float("nan")
    for step in range(steps):
        batch = [encoded[rng.randrange(len(encoded))] for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (row, start) in enumerate(batch):
            ids[i, : len(row)] = torch.tensor(row)
            labels[i, start : len(row)] = torch.tensor(row[start:])
            mask[i, : len(row)] = 1
        loss = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        loss_value = loss.item()
        if keep_at and step + 1 in keep_at and step + 1 < steps:
            keep_at[step + 1](model, tokenizer)
        if step % 250 == 0 or step == steps - 1:
            print(f"  pretrain step {step:>5}  loss {loss_value:.4f}", flush=True)
    model.save_pretrained(model_dir)
    return loss_value
