"""Train a discriminative PRM, recorded like every training run: from outcome labels alone
(``OutcomeExample``: the outcome-supervised PRM) or from a snapshot's step labels
(``StepExample``: the step-label PRM, Math-Shepherd's practice).

TRL no longer ships a PRM trainer, and this one is small: encode each solution once, then
minimise ``outcome_loss`` (BCE of the outcome on the aggregated step probabilities) or
``step_loss`` (BCE of each labelled step's probability against its label) with AdamW.  Both
share the backbone, the head, the checkpoints and the scoring.  Checkpoints
(``OUTPUT/checkpoint-N``: the model, the optimizer, the step) are written whole and then
renamed into place, so a killed trainer resumes from the last complete one
and continues exactly as the uninterrupted run would have (the batch order is a function of
the seed and step, the dropout of the seed and step).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from stepq.models.errors import ConfigError
from stepq.trainer.prm.aggregate import AGGREGATES, outcome_loss, predict_log_prob, step_loss
from stepq.trainer.prm.model import HEADS, Encoded, StepScorer, collate
from stepq.trainer.prm.step_labels import TARGETS, StepExample

log = logging.getLogger(__name__)
STATE = "trainer_state.pt"


@dataclass(frozen=True)
class PRMConfig:
    """A PRM recipe's ``trainer:`` fields."""

    aggregate: str = "asymmetric"
    temperature: float = 0.1
    """softmin's temperature (only used with ``aggregate: softmin``)."""
    head: str = "mlp"
    """``mlp`` (two layers, the paper's head) or ``linear``."""
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    warmup_steps: int = 1000
    """Linear learning-rate warmup from ~0 over this many steps (then constant)."""
    max_grad_norm: float | None = None
    """Clip the gradient's global norm to this (None: no clipping)."""
    curriculum_steps: int = 0
    """Short solutions first: the first this many optimizer steps draw only solutions of at
    most ``curriculum_max_solution_steps`` steps, whose outcome says more about each step
    (a one-step solution's outcome is its step's label).  Then the whole set, as usual."""
    curriculum_max_solution_steps: int = 1
    batch_size: int = 32
    """Solutions per optimizer step, across ``gradient_accumulation_steps`` forward passes."""
    gradient_accumulation_steps: int = 1
    """Forward passes per optimizer step (each of ``batch_size / gradient_accumulation_steps``
    solutions): the same batch when memory is short."""
    epochs: int = 1
    max_steps: int | None = None
    """Stop here even if the epochs are not done."""
    max_length: int | None = None
    """Tokens per solution (default: the backbone's positions); longer ones are skipped."""
    save_steps: int = 500
    logging_steps: int = 10
    seed: int = 0
    step_targets: str = "hard"
    """Step labels (a snapshot): ``hard``, the snapshot's rule (Math-Shepherd's hard estimate),
    or ``soft``, the chunk's Q-value (its soft estimate).  Outcome training ignores it."""

    def __post_init__(self) -> None:
        if self.step_targets not in TARGETS:
            raise ConfigError(f"PRM step_targets '{self.step_targets}' is not one of: {', '.join(TARGETS)}")
        if self.head not in HEADS:
            raise ConfigError(f"PRM head '{self.head}' is not one of: {', '.join(HEADS)}")
        if self.gradient_accumulation_steps < 1 or self.batch_size % self.gradient_accumulation_steps:
            raise ConfigError("PRM gradient_accumulation_steps must be positive and divide batch_size")
        if self.aggregate not in AGGREGATES:
            raise ConfigError(f"PRM aggregate '{self.aggregate}' is not one of: {', '.join(AGGREGATES)}")
        if self.batch_size < 1 or self.epochs < 1 or self.save_steps < 1 or self.logging_steps < 1:
            raise ConfigError("PRM batch_size, epochs, save_steps and logging_steps must be positive")
        if self.warmup_steps < 0 or (self.max_grad_norm is not None and self.max_grad_norm <= 0):
            raise ConfigError("PRM warmup_steps must be >= 0 and max_grad_norm positive")
        if self.curriculum_steps < 0 or self.curriculum_max_solution_steps < 1:
            raise ConfigError("PRM curriculum_steps must be >= 0 and curriculum_max_solution_steps positive")

    def learning_rate_at(self, step: int) -> float:
        """The rate for (0-based) ``step``: a pure function of the step, so a resumed run
        continues the schedule where the killed one stopped."""
        if step >= self.warmup_steps:
            return self.learning_rate
        return self.learning_rate * (step + 1) / self.warmup_steps


@dataclass(frozen=True)
class OutcomeExample:
    problem: str
    steps: tuple[str, ...]
    outcome: bool


def load_outcomes(folder: Path) -> list[OutcomeExample]:
    """An ``stepq export outcomes`` folder (``train.jsonl``)."""
    path = folder / "train.jsonl" if folder.is_dir() else folder
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read outcomes {path}: {exc.strerror}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            out.append(OutcomeExample(str(r["prompt"]), tuple(str(s) for s in r["steps"]), bool(r["outcome"])))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{n}: not an outcome record ({exc})") from None
    return out


def batches(n: int, batch_size: int, seed: int, epoch_no: int) -> list[list[int]]:
    """The example order of one epoch: a permutation fixed by (seed, epoch)."""
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch_no).shuffle(order)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


class BatchOrder:
    """Which examples each optimizer step trains on: a pure function of the step, so a resumed
    run draws what the killed one would have.  During the curriculum, epochs over the short
    solutions alone; after it, epochs over all of them, counted from the curriculum's end.
    Each epoch's permutation is drawn once, not on every step."""

    def __init__(self, solution_steps: Sequence[int], config: PRMConfig) -> None:
        self._size, self._seed, self._curriculum = config.batch_size, config.seed, config.curriculum_steps
        short = [i for i, n in enumerate(solution_steps) if n <= config.curriculum_max_solution_steps]
        if self._curriculum and not short:
            raise ConfigError(f"PRM curriculum: no solution has at most {config.curriculum_max_solution_steps} steps")
        self._pools = (short, list(range(len(solution_steps))))
        self._epoch: tuple[tuple[int, int], list[list[int]]] | None = None

    def at(self, step: int) -> list[int]:
        """The examples of (0-based) optimizer ``step``."""
        phase, local = (0, step) if step < self._curriculum else (1, step - self._curriculum)
        pool = self._pools[phase]
        epoch_no, offset = divmod(local, -(-len(pool) // self._size))
        if self._epoch is None or self._epoch[0] != (phase, epoch_no):
            order = batches(len(pool), self._size, self._seed, epoch_no)
            self._epoch = ((phase, epoch_no), [[pool[i] for i in b] for b in order])
        return self._epoch[1][offset]


def last_checkpoint(output_dir: Path) -> Path | None:
    found = [p for p in output_dir.glob("checkpoint-*") if (p / STATE).exists() and p.name.split("-")[-1].isdigit()]
    return max(found, key=lambda p: int(p.name.split("-")[-1])) if found else None


class PRMTrainer:
    """stepq's PRM trainer, with the surface the run executor drives a TRL trainer by: built
    with its callbacks (transformers' ``TrainerCallback`` hooks: ``on_train_begin``,
    ``on_step_end``, ``on_log``, ``on_save``), ``train(resume_from_checkpoint)``,
    ``save_model``, ``state.global_step``; and where its own checkpoints are
    (``last_checkpoint``)."""

    processing_class = None

    def __init__(
        self,
        model: str,
        args: PRMConfig,
        train_dataset: Sequence[OutcomeExample] | Sequence[StepExample],
        output_dir: Path,
        callbacks: Sequence[Any] = (),
    ) -> None:
        if not train_dataset:
            raise ConfigError("the PRM has no labelled solutions to train on")
        if len({type(e) for e in train_dataset}) > 1:
            raise ConfigError("outcome and step examples do not train one PRM together")
        self.base_model, self.config, self.examples = model, args, train_dataset
        self.output_dir = output_dir
        self.callbacks = list(callbacks)
        self.stepwise = isinstance(train_dataset[0], StepExample)
        self.state = SimpleNamespace(global_step=0, max_steps=0)
        self.model: StepScorer | None = None

    @staticmethod
    def last_checkpoint(output_dir: Path) -> Path | None:
        return last_checkpoint(output_dir)

    def _hook(self, name: str, **kw: Any) -> None:
        args = SimpleNamespace(output_dir=str(self.output_dir))
        for callback in self.callbacks:
            getattr(callback, name)(args, self.state, None, **kw)

    def train(self, resume_from_checkpoint: str | None = None) -> None:
        import torch

        config, resume = self.config, Path(resume_from_checkpoint) if resume_from_checkpoint else None
        model = (
            StepScorer.load(resume)
            if resume
            else StepScorer.starting_from(self.base_model, config.max_length, config.seed, config.head)
        )
        self.model = model
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model.to(device)
        encoded, targets = _encode(model, self.examples)
        per_epoch = -(-len(encoded) // config.batch_size)
        full = config.curriculum_steps + per_epoch * config.epochs
        total = min(config.max_steps or full, full)
        order = BatchOrder([len(e.ends) for e in encoded], config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
        step = 0
        if resume:
            state = torch.load(resume / STATE, map_location=device, weights_only=False)
            optimizer.load_state_dict(state["optimizer"])
            step = int(state["step"])
            log.info("the PRM resumes from %s at step %s", resume, step)
        self.state.global_step, self.state.max_steps = step, total
        self._hook("on_train_begin")
        model.train(True)
        window: list[tuple[float, list[bool], list[bool]]] = []
        started = time.monotonic()
        while step < total:
            loss, predicted, truth = self._step(model, optimizer, encoded, targets, order.at(step), step, device)
            step += 1
            self.state.global_step = step
            window.append((loss, predicted, truth))
            self._hook("on_step_end")
            if step % config.logging_steps == 0 or step == total:
                logs = _window_logs(window)
                log.info("PRM step %d/%d: loss %.4f (%.0f s)", step, total, logs["loss"], time.monotonic() - started)
                self._hook("on_log", logs=logs)
                window = []
            if step % config.save_steps == 0 or step == total:
                self._checkpoint(model, optimizer, step)
                self._hook("on_save")

    def _step(
        self,
        model: StepScorer,
        optimizer: Any,
        encoded: Sequence[Encoded],
        targets: Sequence[Any],
        index: list[int],
        step: int,
        device: Any,
    ) -> tuple[float, list[bool], list[bool]]:
        """One optimizer step over the examples ``index``: its loss, and each labelled
        prediction beside its truth (per-class accuracy)."""
        import torch

        config = self.config
        torch.manual_seed(config.seed * 1_000_003 + step)  # dropout: a resumed run draws what it would have
        optimizer.zero_grad()
        losses, predicted, truth = [], [], []
        for part in _micro_batches(len(index), config.gradient_accumulation_steps):
            tensors = collate([encoded[index[i]] for i in part], model.pad_id)
            ids, attention, ends, mask = (t.to(device) for t in tensors)
            logits = model.logits(ids, attention, ends)
            if self.stepwise:  # each labelled step against its label
                y, labelled = _step_targets([targets[index[i]] for i in part], mask.shape[1], device)
                labelled = labelled & mask
                loss = step_loss(logits, labelled, y)
                with torch.no_grad():
                    predicted.extend((logits[labelled] >= 0).tolist())
                    truth.extend((y[labelled] >= 0.5).tolist())
            else:
                y = torch.tensor([targets[index[i]] for i in part], device=device)
                loss = outcome_loss(logits, mask, y, config.aggregate, config.temperature)
                with torch.no_grad():
                    # what the model predicts, whatever the truth: an aggregate chosen by the
                    # outcome (asymmetric's loss) would grade each class by its own easier rule
                    lp = predict_log_prob(logits, mask, config.aggregate, config.temperature)
                    predicted.extend((lp.exp() >= 0.5).tolist())
                    truth.extend(y.bool().tolist())
            (loss * len(part) / len(index)).backward()  # the mean over the whole batch
            losses.append(loss.item() * len(part) / len(index))
        if config.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        for group in optimizer.param_groups:
            group["lr"] = config.learning_rate_at(step)
        optimizer.step()
        return sum(losses), predicted, truth

    def _checkpoint(self, model: StepScorer, optimizer: Any, step: int) -> None:
        """Written whole, then renamed into place: a killed trainer resumes from a complete one."""
        import torch

        final = self.output_dir / f"checkpoint-{step}"
        partial = self.output_dir / f".checkpoint-{step}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        model.save(partial, **_meta(self.config, self.stepwise))
        torch.save({"optimizer": optimizer.state_dict(), "step": step, "saved_at": time.time()}, partial / STATE)
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)

    def save_model(self, path: str) -> None:
        assert self.model is not None, "train first"
        self.model.save(Path(path), **_meta(self.config, self.stepwise))


def _micro_batches(size: int, accumulation: int) -> list[list[int]]:
    """Positions 0..size-1 in ``accumulation`` consecutive slices (the last batch of an epoch
    may be short; empty slices are dropped)."""
    per = -(-size // accumulation)
    return [list(range(i, min(i + per, size))) for i in range(0, size, per)]


def _step_targets(rows: Sequence[Sequence[float | None]], width: int, device: Any) -> tuple[Any, Any]:
    """Per-step targets padded to ``width`` and the mask of the steps that have one."""
    import torch

    y = torch.zeros((len(rows), width), device=device)
    labelled = torch.zeros((len(rows), width), dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        for k, value in enumerate(row[:width]):
            if value is not None:
                y[i, k], labelled[i, k] = float(value), True
    return y, labelled


def _encode(model: StepScorer, examples: Iterable[OutcomeExample | StepExample]) -> tuple[list[Encoded], list[Any]]:
    """Each example's encoding and its target: the outcome (1.0 / 0.0), or the steps' targets."""
    encoded: list[Encoded] = []
    outcomes: list[Any] = []
    skipped = 0
    for ex in examples:
        e = model.encode(ex.problem, ex.steps)
        if len(e.ends) < len(ex.steps) or not e.ends:
            skipped += 1  # a cut solution would hide the step an outcome may be about
            continue
        if isinstance(ex, StepExample) and all(t is None for t in ex.targets):
            continue
        encoded.append(e)
        outcomes.append(list(ex.targets) if isinstance(ex, StepExample) else (1.0 if ex.outcome else 0.0))
    if skipped:
        log.warning("%d solutions longer than %d tokens were left out", skipped, model.max_length)
    if not encoded:
        raise ConfigError(f"every solution is longer than the PRM's {model.max_length} tokens (raise max_length)")
    return encoded, outcomes


def _meta(config: PRMConfig, stepwise: bool = False) -> dict[str, Any]:
    """What the saved model says of its training.  A step-label PRM's scores are ranked by their
    minimum (Math-Shepherd's Best-of-N): that is its ``aggregate`` for Best-of-N unless told."""
    if stepwise:
        return {
            "aggregate": "min",
            "temperature": config.temperature,
            "labels": f"steps:{config.step_targets}",
            "config": asdict(config),
        }
    return {
        "aggregate": config.aggregate,
        "temperature": config.temperature,
        "labels": "outcomes",
        "config": asdict(config),
    }


def _window_logs(window: list[tuple[float, list[bool], list[bool]]]) -> dict[str, Any]:
    """Mean loss and per-class accuracy over the steps since the last log (the predicted
    aggregate >= 0.5 against the outcome, or each labelled step's prediction against its label)."""
    hits = {True: 0, False: 0}
    seen = {True: 0, False: 0}
    for _, predicted, truth in window:
        for p, t in zip(predicted, truth, strict=True):
            seen[t] += 1
            hits[t] += p == t
    return {
        "loss": sum(w[0] for w in window) / len(window),
        "examples": sum(seen.values()),
        "accuracy_positive": hits[True] / seen[True] if seen[True] else None,
        "accuracy_negative": hits[False] / seen[False] if seen[False] else None,
    }
