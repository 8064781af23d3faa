"""The step-label PRM (Math-Shepherd's practice): a discriminative PRM trained on a snapshot's
per-step labels, hard (the snapshot's rule) or soft (the chunk's Q-value), through the same
trainer, backbone and scoring as the outcome-supervised one."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from sqlalchemy import text

from stepq.models import Database
from stepq.trainer.methods.prm import snapshot_steps
from stepq.trainer.prm.aggregate import step_loss
from stepq.trainer.prm.model import StepScorer
from stepq.trainer.prm.step_labels import StepExample, examples_from_rows
from stepq.trainer.tiny_model import build_tiny_model
from stepq.trainer.training.recipe import Recipe
from tests.trainer_helpers import train_records


def test_step_loss_is_the_bce_of_the_labelled_steps_only() -> None:
    logits = torch.tensor([[0.0, 2.0, -1.0], [1.0, 0.0, 0.0]])
    labelled = torch.tensor([[True, False, True], [True, False, False]])
    targets = torch.tensor([[1.0, 0.0, 0.0], [0.5, 1.0, 1.0]])
    by_hand = [math.log(2), math.log(1 + math.exp(-1.0)), math.log(1 + math.exp(1.0)) - 0.5 * 1.0]
    # BCE(logit x, y) = log(1 + e^x) - y x: step 1 (0, 1) = log 2; (-1, 0) = log(1 + e^-1); (1, 0.5)
    assert step_loss(logits, labelled, targets).item() == pytest.approx(sum(by_hand) / 3, abs=1e-6)
    assert step_loss(logits, labelled, 1 - targets).item() != pytest.approx(sum(by_hand) / 3)


def test_examples_read_each_trajectorys_rows_with_their_targets() -> None:
    """One example a trajectory, its steps up to the last labelled one; a step the snapshot
    does not hold (a balanced snapshot leaves some out) is context with no target."""

    def row(t: int, i: int, label: str, q: float) -> dict[str, object]:
        steps = [f"s{t}.{k}" for k in range(1, 4)]
        return {
            "trajectory_id": t,
            "chunk_index": i,
            "history": steps[: i - 1],
            "chunk": steps[i - 1],
            "problem": f"P{t}",
            "label": label,
            "q_after": q,
        }

    rows = [row(2, 3, "Negative", 0.0), row(1, 1, "Positive", 0.75), row(2, 1, "Positive", 0.5)]
    hard = examples_from_rows(rows)
    assert hard == [
        StepExample("P1", ("s1.1",), (1.0,)),
        StepExample("P2", ("s2.1", "s2.2", "s2.3"), (1.0, None, 0.0)),
    ]
    soft = examples_from_rows(rows, "soft")
    assert [e.targets for e in soft] == [(0.75,), (0.5, None, 0.0)]


def _solution(rng: random.Random, i: int) -> tuple[str, list[str], list[bool]]:
    oks = [rng.random() > 0.35 for _ in range(rng.randint(2, 4))]
    return f"Problem {i}?", [f"Step {k + 1}: {'ok' if ok else 'bad'}.\n\n" for k, ok in enumerate(oks)], oks


def _auc(scores: list[float], truth: list[bool]) -> float:
    pos = [s for s, t in zip(scores, truth, strict=True) if t]
    neg = [s for s, t in zip(scores, truth, strict=True) if not t]
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


@pytest.mark.slow
def test_inverted_step_labels_lower_held_out_step_auc(sqlite: Database, tmp_path: Path) -> None:
    """A cue the model can see ("bad" in a step), its steps labelled: trained on the labels,
    held-out step AUC above 0.8 (0.88 here); on the same steps with every label inverted, below the right
    run's (near 0).  A swapped label or target anywhere in the path fails one of the two."""
    rng = random.Random(0)
    train = [_solution(rng, i) for i in range(300)]
    test = [_solution(rng, 1000 + i) for i in range(100)]
    model = build_tiny_model(tmp_path / "base", n_positions=256)
    recipe = Recipe.parse(
        f"method: prm\nmodel: {model}\ntrainer:\n  learning_rate: 0.003\n  warmup_steps: 0\n"
        "  batch_size: 16\n  epochs: 20\n  max_steps: 150\n  save_steps: 150\n  logging_steps: 50\n"
    )
    aucs = {}
    for name, flip in (("right", False), ("inverted", True)):
        examples = [StepExample(q, tuple(steps), tuple(float(ok != flip) for ok in oks)) for q, steps, oks in train]
        run = train_records(sqlite, "prm", examples, f"toy-{name}", recipe, tmp_path / name)
        scorer = StepScorer.load(run.final_model)
        assert scorer.meta["labels"] == "steps:hard" and scorer.meta["aggregate"] == "min"
        rows = scorer.score([(q, steps) for q, steps, _ in test])
        scores = [s for row in rows for s in row if s is not None]
        aucs[name] = _auc(scores, [ok for _, _, oks in test for ok in oks])
    assert aucs["right"] > 0.8 and aucs["inverted"] < 0.2, aucs


@pytest.mark.slow
def test_stepq_train_prm_on_a_snapshot_reads_its_labels_and_q_values(sqlite: Database, tmp_path: Path) -> None:
    """`stepq train --method prm --snapshot N` (through the API the command calls) trains the
    step-label PRM on the snapshot's rows; its soft targets are the stored Q-values, the mean
    reward of each prefix's rollouts in the rollouts table."""
    from stepq.api import Stepq, tiny_model

    url = str(sqlite.engine.url)
    sq = Stepq(url)
    sq.synth("steps", problems=16, seed=2, error_rate=0.3)
    sq.annotate("steps", rollouts=4)
    sq.run("steps")
    number = sq.create_snapshot(["steps"], rule="abs-q", val_fraction=0.25)
    soft = snapshot_steps(sqlite, number, targets="soft")
    hard = snapshot_steps(sqlite, number)
    assert [e.steps for e in soft] == [e.steps for e in hard] and soft
    with sqlite.engine.connect() as conn:
        means = {
            (tid, k): float(m)
            for tid, k, m in conn.execute(
                text("SELECT trajectory_id, prefix_len, avg(reward) FROM rollouts GROUP BY trajectory_id, prefix_len")
            )
        }
        outcomes = {int(t): float(o) for t, o in conn.execute(text("SELECT id, outcome FROM trajectories"))}
        contexts = {
            (
                str(p),
                "".join(
                    c
                    for (c,) in conn.execute(
                        text("SELECT text FROM chunks WHERE trajectory_id = :t ORDER BY idx"), {"t": t}
                    )
                ),
            ): int(t)
            for t, p in conn.execute(
                text("SELECT t.id, p.question FROM trajectories t JOIN problems p ON p.id = t.problem_id")
            )
        }
    checked = 0
    for example in soft:
        whole = next(
            tid
            for (q, body), tid in contexts.items()
            if q == example.problem and body.startswith("".join(example.steps))
        )
        for k, target in enumerate(example.targets, start=1):
            if target is not None:  # after the last chunk: the trajectory's own outcome
                expected = means.get((whole, k), outcomes[whole])
                assert target == pytest.approx(expected), (whole, k)
                checked += 1
    assert checked > 0
    for example_h, example_s in zip(hard, soft, strict=True):
        for h, s in zip(example_h.targets, example_s.targets, strict=True):
            assert (h is None) == (s is None) and (h is None or h == float(s > 0)), "Abs-Q: positive iff Q > 0"
    model = tiny_model(tmp_path / "tiny", arch="gpt2", width=64)
    result = sq.train(
        method="prm",
        snapshot=number,
        model=str(model),
        output=tmp_path / "run",
        recipe_options=["trainer.max_steps=3", "trainer.batch_size=4", "trainer.warmup_steps=0"],
    )
    assert result.status == "done"
    assert StepScorer.load(result.final_model).meta["labels"] == "steps:hard"
    with sqlite.engine.connect() as conn:
        dataset = conn.execute(
            text("SELECT dataset FROM training_runs WHERE id = :i"), {"i": result.run_id}
        ).scalar_one()
    assert dataset == f"steps:snapshot-{number}:hard"
