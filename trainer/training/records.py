"""Record a training run in the database as it goes: metrics per logging step, checkpoints,
and the run's lease (renewed every step, so a crashed trainer's run can be taken over)."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from stepq.models import Database
from stepq.models import training_queries as tq
from stepq.models.base import epoch
from stepq.models.errors import LeaseLost
from stepq.trainer.judge.prompt import parse_verdict
from stepq.trainer.judge.rewards import RewardFn, completion_text, label_value

# TRL's log keys for the metrics operators look at first (names vary across versions).
METRIC_KEYS = {
    "reward": ("reward",),
    "completion_length": ("completions/mean_length", "completion_length"),
    "clip_ratio": ("clip_ratio/region_mean", "clip_ratio"),
    "entropy": ("entropy",),
    "loss": ("loss",),
}


def process_owner() -> str:
    """Unique per process: host, pid and a random part (hosts may share names and pids)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ClassAccuracy:
    """Per-class verdict accuracy of the completions scored since the last log."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.hits = {True: 0, False: 0}
        self.seen = {True: 0, False: 0}

    def add(self, completions: Sequence[Any], labels: Sequence[Any]) -> None:
        with self._lock:
            for completion, label in zip(completions, labels, strict=True):
                lab = label_value(label)
                self.seen[lab] += 1
                self.hits[lab] += parse_verdict(completion_text(completion)) == lab

    def take(self) -> dict[str, float | None]:
        with self._lock:
            out = {
                "accuracy_positive": self.hits[True] / self.seen[True] if self.seen[True] else None,
                "accuracy_negative": self.hits[False] / self.seen[False] if self.seen[False] else None,
            }
            self.reset()
            return out

    def wrap(self, fn: RewardFn) -> RewardFn:
        """The same reward, also counting per-class accuracy; keeps TRL's name for it."""

        def tracked(completions: Sequence[Any], label: Sequence[Any] = (), **kw: Any) -> list[float]:
            if label:
                self.add(completions, label)
            return fn(completions, label=label, **kw)

        tracked.__name__ = fn.__name__
        return tracked


def metric_row(run_id: int, step: int, logs: dict[str, Any], accuracy: dict[str, float | None]) -> dict[str, Any]:
    row: dict[str, Any] = {"run_id": run_id, "step": step, "logged_at": epoch(), **accuracy}
    for column, keys in METRIC_KEYS.items():
        row[column] = next((float(logs[k]) for k in keys if isinstance(logs.get(k), int | float)), None)
    row["values"] = {k: v for k, v in logs.items() if isinstance(v, int | float | str | bool)}
    return row


def make_recorder(
    db: Database,
    run_id: int,
    owner: str,
    ttl: float,
    accuracy: ClassAccuracy,
    on_step: Callable[[], None] | None = None,
) -> Any:
    """A transformers TrainerCallback writing the run's progress to the database."""
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):  # type: ignore[misc]
        def _renew(self, **values: Any) -> None:
            with db.session() as session:
                if not tq.renew_run(session, run_id, owner, ttl, **values):
                    raise LeaseLost(f"training run {run_id} was taken over by another trainer")

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._renew(max_steps=int(state.max_steps or 0) or None, global_step=int(state.global_step))

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._renew(global_step=int(state.global_step))
            if on_step is not None:
                on_step()

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if not logs or "train_runtime" in logs:
                return
            with db.session() as session:
                tq.upsert_metrics(session, [metric_row(run_id, int(state.global_step), logs, accuracy.take())])

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            with db.session() as session:
                if not tq.record_checkpoint(session, run_id, owner, ttl, path, int(state.global_step)):
                    raise LeaseLost(f"training run {run_id} was taken over by another trainer")

    return Recorder()
