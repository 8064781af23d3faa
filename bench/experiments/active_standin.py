"""``bench_active``'s stand-in judge (``--judge digit-mlp``), named so: a small MLP reading each
step's numbers digit by digit, which learns the synthetic policy's check from thousands of
labels in seconds, so that the ordering is measured given a judge that learns.

It trains as a method of its own (``DigitStandIn``, one module's worth, as a plugin's method
would) through ``methods.train``: each round is a training run the executor records, and the
priority round's judge is the model that run saved, loaded back (``DigitJudge.load``).  It is
not registered: no one trains it by ``stepq train``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sqlalchemy import text

from stepq.models import Database
from stepq.trainer.methods import Method, TrainingData
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.runs import RunPlan, RunSpec, TrainOptions

_STEP = re.compile(r"(-?\d+) ([+*-]) (-?\d+) = (-?\d+)")
_OPS = "+-*"


def step_features(step: str) -> list[float] | None:
    """The step's equation as the operator and each number's sign and last digit, one-hot:
    where the synthetic policy's errors always show (``synthetic_policy.Numbers``), so a
    small MLP learns the check from thousands of labels rather than millions.  None: no
    equation in the text."""
    m = _STEP.search(step)
    if not m:
        return None
    out: list[float] = []
    for number in (m.group(1), m.group(3), m.group(4)):
        one_hot = [0.0] * 10
        one_hot[int(number[-1])] = 1.0
        out.append(1.0 if number.startswith("-") else 0.0)
        out.extend(one_hot)
    out.extend(1.0 if m.group(2) == op else 0.0 for op in _OPS)
    return out


class DigitJudge:
    """A stand-in step judge: P(step right) from an MLP over ``step_features``; a chunk's
    score is the lowest of its steps' so far (a chunk is right only if every step is)."""

    name = "digit-mlp"
    threshold = 0.5

    def __init__(self, model: Any) -> None:
        self.model = model

    def score_solutions(self, solutions: Sequence[tuple[str, Sequence[str]]]) -> list[list[float | None]]:
        import torch

        feats = [[step_features(s) for s in steps] for _, steps in solutions]
        flat = [f for row in feats for f in row if f is not None]
        probs = iter([])
        if flat:
            with torch.no_grad():
                probs = iter(torch.sigmoid(self.model(torch.tensor(flat))).squeeze(-1).tolist())
        out: list[list[float | None]] = []
        for row in feats:
            running, scores = 1.0, []
            for f in row:
                if f is not None:
                    running = min(running, next(probs))
                scores.append(running)
            out.append(scores)
        return out


def fit_digit_judge(examples: Sequence[tuple[list[float], bool]], seed: int, epochs: int) -> DigitJudge:
    import torch

    torch.manual_seed(seed)
    width = len(examples[0][0])
    model = torch.nn.Sequential(torch.nn.Linear(width, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    x = torch.tensor([f for f, _ in examples])
    y = torch.tensor([[1.0 if label else 0.0] for _, label in examples])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-4)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for _ in range(epochs):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    model.eval()
    return DigitJudge(model)


def labelled_steps(db: Database) -> list[tuple[list[float], bool]]:
    """Every labelled trajectory's steps up to its first negative label, with their Monte
    Carlo labels (after a wrong step every label is negative, whatever that step computes)."""
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.trajectory_id, c.idx, c.text, l.positive FROM chunk_labels l "
                "JOIN chunks c ON c.id = l.chunk_id ORDER BY c.trajectory_id, c.idx"
            )
        ).all()
    out: list[tuple[list[float], bool]] = []
    stopped: set[int] = set()
    for tid, _, chunk, positive in rows:
        f = step_features(chunk)
        if tid in stopped or f is None:
            continue
        out.append((f, bool(positive)))
        if not positive:
            stopped.add(tid)
    return out


WEIGHTS = "digit-mlp.pt"


def _network(width: int) -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(width, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))


def load_judge(folder: Path) -> DigitJudge:
    """The judge a stand-in run saved (``final/`` of its folder)."""
    import torch

    meta = json.loads((folder / "config.json").read_text())
    model = _network(int(meta["features"]))
    model.load_state_dict(torch.load(folder / WEIGHTS, weights_only=True))
    model.eval()
    return DigitJudge(model)


class DigitTrainer:
    """The executor's trainer surface around ``fit_digit_judge``: one full-batch step an epoch,
    no checkpoints (a killed round trains again, in seconds)."""

    processing_class = None

    def __init__(self, examples: Sequence[tuple[list[float], bool]], seed: int, epochs: int, callbacks: Any) -> None:
        self.examples, self.seed, self.epochs = examples, seed, epochs
        self.state = SimpleNamespace(global_step=0)
        self.judge: DigitJudge | None = None

    @staticmethod
    def last_checkpoint(output_dir: Path) -> None:
        return None

    def train(self, resume_from_checkpoint: str | None = None) -> None:
        self.judge = fit_digit_judge(self.examples, self.seed, self.epochs)
        self.state.global_step = self.epochs

    def save_model(self, path: str) -> None:
        import torch

        assert self.judge is not None, "train first"
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.judge.model.state_dict(), folder / WEIGHTS)
        (folder / "config.json").write_text(
            json.dumps({"model_type": "digit-mlp", "features": len(self.examples[0][0])})
        )


class DigitStandIn(Method):
    name = "digit-mlp"
    summary = "bench_active's stand-in step judge (records of step features and labels)"

    def plan(
        self, db: Database, recipe: Recipe, data: TrainingData, output_dir: Path, options: TrainOptions
    ) -> RunPlan:
        data.only(self.name, "records")
        settings = recipe.trainer
        return RunPlan(
            RunSpec(self.name, recipe.text, recipe.model, output_dir, dataset=data.source()),
            DigitTrainer,
            {"examples": list(data.records or ()), "seed": int(settings["seed"]), "epochs": int(settings["epochs"])},
        )


def stand_in_recipe(base: Path, seed: int, epochs: int) -> Recipe:
    """The stand-in's recipe; ``base`` a folder describing its (untrained) network, since every
    run names the model it starts from."""
    base.mkdir(parents=True, exist_ok=True)
    (base / "config.json").write_text(json.dumps({"model_type": "digit-mlp", "hidden": 256}))
    return Recipe.parse(f"method: digit-mlp\nmodel: {base}\ntrainer:\n  seed: {seed}\n  epochs: {epochs}\n")


def round_judge(db: Database, root: Path, out: Path, seed: int, epochs: int) -> tuple[int, DigitJudge, int]:
    """One round's stand-in on every label so far, as a training run of ``db``: (the run's id,
    the judge it saved, the labelled steps it learnt from)."""
    from stepq.trainer import methods
    from stepq.workers.priority.rounds import accept_judge_method

    accept_judge_method(DigitStandIn.name)  # the arm's runtime builds its judges (judge_factory)
    examples = labelled_steps(db)
    data = TrainingData(records=examples, name=f"bench-active:digit-features:{out.name}")
    result = methods.train(
        db, DigitStandIn(), stand_in_recipe(root / "digit-mlp-base", seed, epochs), data, out, TrainOptions()
    )
    return result.run_id, load_judge(result.final_model), len(examples)
