"""Record a training run in the database as it goes: metrics per logging step, checkpoints,
and the run's lease (renewed every step, so a crashed trainer's run can be taken over)."""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from stepq.models import Database, queries
from stepq.models.base import epoch
from stepq.models.errors import LeaseLost
from stepq.trainer.generative_judge.prompt import parse_verdict
from stepq.trainer.generative_judge.rewards import RewardFn, completion_text, label_value
from stepq.trainer.training.ranks import all_reduce_sum, current_rank

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
        """The accuracies since the last call, over every rank's completions (each rank
        scores only its share of the prompts): a collective under a multi-process launch,
        so every rank calls it at the same logging step."""
        with self._lock:
            counts = [self.hits[True], self.seen[True], self.hits[False], self.seen[False]]
            self.reset()
        hits_pos, seen_pos, hits_neg, seen_neg = all_reduce_sum([float(c) for c in counts])
        return {
            "accuracy_positive": hits_pos / seen_pos if seen_pos else None,
            "accuracy_negative": hits_neg / seen_neg if seen_neg else None,
        }

    def wrap(self, fn: RewardFn) -> RewardFn:
        """The same reward, also counting per-class accuracy; keeps TRL's name for it."""

        def tracked(completions: Sequence[Any], label: Sequence[Any] = (), **kw: Any) -> list[float]:
            if label:
                self.add(completions, label)
                trace_prompts(kw.get("chunk_id"))
            return fn(completions, label=label, **kw)

        tracked.__name__ = fn.__name__
        return tracked


def trace_prompts(chunk_ids: Sequence[Any] | None) -> None:
    """With ``STEPQ_TRACE_DIR`` set, append the snapshot chunks this rank was just rewarded
    on to ``rank-N.jsonl`` there, one line per reward call: how an operator (and the
    multi-process test) sees which share of the prompts each rank trained on."""
    folder = os.environ.get("STEPQ_TRACE_DIR")
    if not folder or chunk_ids is None:
        return
    path = os.path.join(folder, f"rank-{current_rank().rank}.jsonl")
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps([int(c) for c in chunk_ids]) + "\n")


def metric_row(run_id: int, step: int, logs: dict[str, Any], accuracy: dict[str, float | None]) -> dict[str, Any]:
    row: dict[str, Any] = {"run_id": run_id, "step": step, "logged_at": epoch(), **accuracy}
    for column, keys in METRIC_KEYS.items():
        row[column] = next((float(logs[k]) for k in keys if isinstance(logs.get(k), int | float)), None)
    row["values"] = {k: v for k, v in logs.items() if isinstance(v, int | float | str | bool)}
    return row


def make_recorder(
    db: Database,
    run_id: int | None,
    owner: str,
    ttl: float,
    accuracy: ClassAccuracy,
    on_step: Callable[[], None] | None = None,
) -> Any:
    """A transformers TrainerCallback writing the run's progress to the database; with
    ``run_id`` None (a rank other than the main one) it writes nothing and only takes part
    in the collectives the main rank's metrics need."""
    from transformers import TrainerCallback

    class Follower(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if logs and "train_runtime" not in logs:
                accuracy.take()

    if run_id is None:
        return Follower()
    rid: int = run_id

    class Recorder(TrainerCallback):  # type: ignore[misc]
        def _renew(self, **values: Any) -> None:
            with db.session() as session:
                if not queries.renew_run(session, rid, owner, ttl, **values):
                    raise LeaseLost(f"training run {rid} was taken over by another trainer")

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._renew(max_steps=int(state.max_steps or 0) or None, global_step=int(state.global_step))

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._renew(global_step=int(state.global_step))
            if on_step is not None:
                on_step()

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if not logs or "train_runtime" in logs:
                return
            # a trainer that measures its own per-class accuracy (the PRM's) logs it; GRPO's
            # is counted by its reward
            counted = accuracy.take()
            measured = {k: logs.get(k, v) for k, v in counted.items()}
            with db.session() as session:
                queries.upsert_metrics(session, [metric_row(rid, int(state.global_step), logs, measured)])

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            with db.session() as session:
                if not queries.record_checkpoint(session, rid, owner, ttl, path, int(state.global_step)):
                    raise LeaseLost(f"training run {rid} was taken over by another trainer")

    return Recorder()
