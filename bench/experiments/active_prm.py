"""stepq's own discriminative PRM as ``bench_active``'s judge (``--judge prm``).

Each round trains ``stepq.trainer.prm``'s ``StepScorer`` (a tiny character-level GPT-2 with
the PRM's step head) on the Monte Carlo labels the set holds so far, one binary
cross-entropy per step on the hard label (the training Math-Shepherd gives Monte Carlo step
labels), and saves it as a training run of method ``prm``.  The priority round then loads it
through the worker's own judge factory (``ScoringJudges``: ``final/`` of the run's output
folder, wrapped as ``PRMJudge``), as a fleet's workers build any round's judge.  (The trainer
service cannot train this judge yet: it trains generative judges on snapshots.)

Every labelled step trains, after a wrong one too (Math-Shepherd's data): the PRM's score of a
step is then the chance that the solution is still right there, the quantity the held-out truth
(every step after the first wrong one is wrong) and the priority strategies read.  The stand-in
instead learns each step alone, from the steps up to the first negative label, and takes the
running minimum; a PRM trained on those would learn a per-step hazard and score every later
step of a broken solution as if the solution were whole.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.experiments.bench_prm import fit_step_labels
from stepq.models import Database, TrainingRun, epoch
from stepq.trainer.training.runs import FINAL


@dataclass(frozen=True)
class PRMSettings:
    """The judge's size and training: small enough for a round to train on CPU in minutes."""

    width: int = 64
    layers: int = 2
    steps: int = 600
    batch_size: int = 32
    lr: float = 1e-3
    warm_start: bool = False
    """Continue from the previous round's judge instead of the fresh backbone each round."""


def labelled_solutions(db: Database) -> list[tuple[str, list[str], list[bool]]]:
    """(problem, steps, labels) per labelled trajectory, every labelled step in order."""
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.trajectory_id, p.question, c.text, l.positive FROM chunk_labels l "
                "JOIN chunks c ON c.id = l.chunk_id JOIN trajectories t ON t.id = c.trajectory_id "
                "JOIN problems p ON p.id = t.problem_id ORDER BY c.trajectory_id, c.idx"
            )
        ).all()
    out: dict[int, tuple[str, list[str], list[bool]]] = {}
    for tid, question, chunk, positive in rows:
        _, steps, labels = out.setdefault(tid, (question, [], []))
        steps.append(chunk)
        labels.append(bool(positive))
    return list(out.values())


def build_backbone(root: Path, settings: PRMSettings, seed: int) -> Path:
    """A random-weight character GPT-2 for the seed, built once and shared by its arms."""
    from stepq.trainer.tiny_model import build_tiny_model

    base = root / f"prm-base-w{settings.width}-l{settings.layers}"
    if not (base / "config.json").is_file():
        build_tiny_model(base, seed=seed, n_positions=512, n_embd=settings.width, n_layer=settings.layers, n_head=2)
    return base


def train_round(
    base: Path,
    previous: Path | None,
    solutions: Sequence[tuple[str, list[str], list[bool]]],
    out: Path,
    settings: PRMSettings,
    seed: int,
) -> float:
    """Train one round's PRM and save it to ``out/final``; returns the seconds it took.

    A fresh start on labels trained on before (every arm's first round: random order for all)
    copies that model instead of training it again: same inputs, same seed, same weights."""
    import torch

    from stepq.trainer.prm.model import StepScorer

    started = time.perf_counter()
    fresh = not (settings.warm_start and previous is not None)
    key = hashlib.sha256(json.dumps([str(base), repr(settings), seed, solutions]).encode()).hexdigest()[:16]
    trained_before = base.parent / "prm-rounds" / key
    if fresh and trained_before.is_dir():
        shutil.copytree(trained_before, out / FINAL)
        return time.perf_counter() - started
    torch.manual_seed(seed)
    if fresh:
        scorer = StepScorer.from_base(str(base), max_length=512, seed=seed)
    else:
        assert previous is not None
        scorer = StepScorer.load(previous)
    encoded = [(scorer.encode(q, steps), labels) for q, steps, labels in solutions]
    fit_step_labels(scorer, encoded, settings.steps, settings.batch_size, settings.lr, seed)
    scorer.save(out / FINAL, trained_on="monte-carlo step labels", steps=settings.steps)
    if fresh:
        shutil.copytree(out / FINAL, trained_before)
    return time.perf_counter() - started


def record_run(
    db: Database, out: Path, base_model: str, recipe: str = "bench_active: PRM on Monte Carlo step labels"
) -> int:
    """A round's judge as a training run, so its priority round is recorded like any other (and
    ``ScoringJudges`` builds a PRM's from ``out/final``)."""
    with db.session() as s:
        run = TrainingRun(
            method="prm",
            recipe=recipe,
            base_model=base_model,
            output_dir=str(out),
            status="done",
            host="bench",
            updated_at=epoch(),
            dataset="bench",
        )
        s.add(run)
        s.flush()
        return run.id


def load_judge(db: Database, run_id: int) -> Any:
    """The run's judge as a priority round's worker builds it."""
    from stepq.trainer.evaluation.scoring_judges import ScoringJudges
    from stepq.workers.priority.strategies import parse_strategy

    return ScoringJudges(db)(run_id, parse_strategy(f"uncertainty:run={run_id}"))
