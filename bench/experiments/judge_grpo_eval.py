"""How the judge benchmark scores a judge: the generative judge's greedy verdicts and its
P(Positive) as a scorer (thresholds tuned on data it is not scored on), and the
outcome-supervised PRM on the same backbone and held-out file, each with bootstrap intervals.
Kept apart from the chain that trains them (``bench_judge_grpo``) so that a judge trained
elsewhere (on a lent GPU, say) is scored by the same code."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from bench.experiments.judge_format import JUDGE_TEMPLATE
from bench.experiments.judge_heldout import by_position, position_items
from bench.experiments.stats import at_threshold, balanced_accuracy, bootstrap, grouped, processbench_f1, rank_auc


class KeptSeed(NamedTuple):
    """What scoring a judge of a kept seed reads: the snapshot's rows, the training rows that tune
    the validation threshold, the held-out and tuning files, and the answer room the judge gets."""

    records: dict[str, list[dict[str, Any]]]
    tune_rows: list[dict[str, Any]]
    files: tuple[Path, Path]
    samples: list[dict[str, Any]]
    completion: int


def kept_seed(db: Any, run_dir: Path, prepared: dict[str, Any]) -> KeptSeed:
    """Read back what ``prepare`` kept in ``run_dir`` (``prepared`` is its ``prepared.json``)."""
    from stepq.models.snapshots import TRAIN
    from stepq.trainer.generative_judge.prompt import JudgePrompt
    from stepq.trainer.snapshots.export import snapshot_records

    records = snapshot_records(db, prepared["snapshot"], JudgePrompt(JUDGE_TEMPLATE))
    by_id = {r["chunk_id"]: r for r in records[TRAIN]}
    files = (run_dir / "heldout.json", run_dir / "tune.json")
    samples = json.loads(files[0].read_text())
    return KeptSeed(records, [by_id[c] for c in prepared["tune_chunks"]], files, samples, prepared["completion"])


def evaluate_kept(model: Path, kept: KeptSeed, seed: int) -> dict[str, Any]:
    """``evaluate`` on a kept seed's validation split, tuning rows and held-out files."""
    from stepq.models.snapshots import VALIDATION

    return evaluate(model, kept.records[VALIDATION], kept.tune_rows, *kept.files, kept.samples, seed, kept.completion)


def evaluate(
    model: Path,
    val_rows: Sequence[dict[str, Any]],
    tune_rows: Sequence[dict[str, Any]],
    pb_file: Path,
    pb_tune_file: Path,
    samples: Sequence[dict[str, Any]],
    seed: int,
    max_tokens: int,
) -> dict[str, Any]:
    """Greedy verdicts, asked as the judge was trained (the settings saved beside it); and the
    judge as a scorer of P(Positive) with thresholds tuned on data it is not scored on (training
    rows for the validation accuracy, another held-out file for ProcessBench)."""
    from stepq.trainer.evaluation import processbench as pb
    from stepq.trainer.evaluation.judge_spec import JudgeSpec, build_judge
    from stepq.trainer.evaluation.judges import GenerativeScorer, StepItem
    from stepq.trainer.generative_judge.judge_prompting import JudgeSettings

    settings = JudgeSettings(JUDGE_TEMPLATE, chat_template=False, max_tokens=max_tokens, source="benchmark")
    if not (model / "stepq-judge.json").exists():
        settings.save(model)
    built = build_judge(JudgeSpec(model=str(model)))
    judge = built.judge
    items = [StepItem(r["problem"], tuple(r["history"]), r["chunk"]) for r in val_rows]
    verdicts = judge.judge(items)
    rows = [(r["problem_id"], r["label"] == "Positive", v) for r, v in zip(val_rows, verdicts, strict=True)]
    acc = balanced_accuracy(rows)
    acc_ci = bootstrap(grouped(rows), lambda g: balanced_accuracy([r for grp in g for r in grp]), seed)
    # how far its P(Positive) ranks the classes, which greedy verdicts hide when it never crosses 0.5
    scorer = GenerativeScorer(judge, "logprob")
    scored = [
        (r["problem_id"], r["label"] == "Positive", p) for r, p in zip(val_rows, scorer.scores(items), strict=True)
    ]
    auc = rank_auc(scored)
    auc_ci = bootstrap(grouped(scored), lambda g: rank_auc([r for grp in g for r in grp]), seed)
    tune_items = [StepItem(r["problem"], tuple(r["history"]), r["chunk"]) for r in tune_rows]
    tuned = [(0, r["label"] == "Positive", p) for r, p in zip(tune_rows, scorer.scores(tune_items), strict=True)]
    threshold = max(sorted({p for _, _, p in tuned}), key=lambda t: balanced_accuracy(at_threshold(tuned, t)))
    at_t = at_threshold(scored, threshold)
    acc_t = balanced_accuracy(at_t)
    acc_t_ci = bootstrap(grouped(at_t), lambda g: balanced_accuracy([r for grp in g for r in grp]), seed)
    scored_pb = pb.evaluate([pb_file], scorer, scoring=True, tune_file=pb_tune_file)["predictions"]
    pairs_t = [(s["label"], scored_pb[s["id"]]) for s in samples]
    report = pb.evaluate([pb_file], judge)
    predictions = report["predictions"]
    pairs = [(s["label"], predictions[s["id"]]) for s in samples]
    f1 = processbench_f1(pairs)
    f1_ci = bootstrap(pairs, processbench_f1, seed)
    pos_items, pos_keys = position_items(samples)
    positions = by_position(samples, scorer.scores(pos_items), pos_keys)
    built.close()
    return {
        "balanced_accuracy": acc,
        "balanced_accuracy_ci": acc_ci,
        "processbench_f1": f1,
        "processbench_f1_ci": f1_ci,
        "positive_share": sum(v is True for v in verdicts) / max(1, len(verdicts)),
        "p_positive_auc": auc,
        "p_positive_auc_ci": auc_ci,
        "threshold": threshold,
        "thresholded_balanced_accuracy": acc_t,
        "thresholded_balanced_accuracy_ci": acc_t_ci,
        "thresholded_processbench_f1": processbench_f1(pairs_t),
        "thresholded_processbench_f1_ci": bootstrap(pairs_t, processbench_f1, seed),
        "p_positive_by_position": positions,
        "outputs": judge.stats.outputs,
        "no_verdict": judge.stats.no_verdict,
    }


def prm_recipe(backbone: Path, steps: int, lr: float, seed: int, batch: int = 32) -> Any:
    """The discriminative PRM recipe the judge benchmarks train with, whatever its data (a set's
    outcomes, a snapshot's step labels): the paper's head and aggregate, a CPU-sized rate."""
    from stepq.trainer.training.recipe import Recipe

    return Recipe.parse(
        f"""method: prm
model: {backbone}
trainer:
  aggregate: asymmetric
  head: mlp
  learning_rate: {lr}
  warmup_steps: {steps // 10}
  batch_size: {batch}
  epochs: 1000
  max_steps: {steps}
  save_steps: {steps}
  logging_steps: 100
  seed: {seed}
"""
    )


def outcome_prm(
    db: Any,
    run_dir: Path,
    files: tuple[Path, Path],
    samples: Sequence[dict[str, Any]],
    args: argparse.Namespace,
    seed: int,
) -> dict[str, Any]:
    """The discriminative PRM on the same set, from its outcome labels alone (every trajectory
    and rollout with an answer), on the same pretrained backbone, scored on the same held-out
    file with a threshold chosen on the tuning file: the comparison StepWiser draws."""
    from stepq.trainer import methods
    from stepq.trainer.evaluation import processbench as pb
    from stepq.trainer.evaluation.judge_spec import JudgeSpec, build_judge
    from stepq.trainer.methods.prm import set_outcomes
    from stepq.trainer.training.runs import TrainOptions

    recipe = prm_recipe(run_dir / "backbone", args.prm_steps, args.prm_lr, seed)
    started = time.perf_counter()
    examples = set_outcomes(db, "judge")
    data = methods.TrainingData(records=examples, name="outcomes:judge")
    result = methods.train(db, "prm", recipe, data, run_dir / "prm", TrainOptions())
    built = build_judge(JudgeSpec(kind="prm", model=str(result.final_model)))
    report = pb.evaluate([files[0]], built.judge, scoring=True, tune_file=files[1])
    pairs = [(s["label"], report["predictions"][s["id"]]) for s in samples]
    built.close()
    return {
        "examples": len(examples),
        "steps": result.global_step,
        "threshold": report["threshold"],
        "processbench_f1": processbench_f1(pairs),
        "processbench_f1_ci": bootstrap(pairs, processbench_f1, seed),
        "train_s": round(time.perf_counter() - started),
    }
