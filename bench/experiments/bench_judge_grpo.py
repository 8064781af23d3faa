"""Does a generative judge learn from stepq's labels?  The whole chain on 2 CPU cores.

Per seed and label rule:
1. a synthetic set with recovery and steps of different difficulty (per-operation error
   rates), annotated through the real task code (Monte Carlo labels, not the truth), and a
   balanced snapshot split by problem;
2. the base judge: a tiny character-level Llama (rotary positions: TRL's left-padded GRPO
   batches shift a GPT-2's learned positions) pretrained on synthetic solutions, then taught
   only the verdict format with **random** verdicts (so it knows how to answer, not what);
3. ``methods.train`` (what ``stepq train`` runs) with the shipped GRPO objective (verdict-match
   reward, clip-higher 0.2/0.28, no KL, loss_type grpo), model size and lengths scaled down;
4. the base and the trained judge evaluated as ``stepq eval snapshot`` and ``stepq eval
   processbench`` evaluate them: balanced accuracy on the snapshot's validation split, and the
   official ProcessBench F1 on a held-out synthetic ProcessBench file written here (problems
   never trained on; first-error labels from the synthetic policy's step truth), each with a
   95% bootstrap interval over problems, against chance (50%; a uniformly random first-error
   guess);
5. the outcome-supervised discriminative PRM on the same set's outcome labels, same backbone,
   same held-out file.

    OMP_NUM_THREADS=2 python -m bench.experiments.bench_judge_grpo                   # seeds 0,1,2, Abs-Q
    python -m bench.experiments.bench_judge_grpo --rules abs-q,rel-ratio,rel-effective --seeds 0
    python -m bench.experiments.bench_judge_grpo --quick                             # a one-minute smoke run
    python -m bench.experiments.bench_judge_grpo --keep runs --reuse --beta 0.1       # GRPO again, same base
    python -m bench.experiments.bench_judge_grpo --policy medium --problems 2000 --analysis spelled \
        --form first-dead --balance position --steps 0 --keep runs-neural            # the neural policy's labels

``--policy weak|medium``: the trajectories are the neural policy's own samples and the rollouts
its continuations (``bench/experiments/neural_policy.py``'s build, through the hf backend), the
labels ``bench_judge_at_work --policy`` puts the trained judge to work on; the held-out file
keeps the synthetic policy's errors, as for every judge here.

docs/experiments/judge_grpo.md holds the figures.

Prints a table per run and one JSON object on its last line.  Keeps nothing unless
``--keep DIR`` is given; with ``--reuse`` a seed prepared there before (same data, backbone and
format settings) skips steps 1-2 and trains into a folder named by its GRPO settings.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import emit
from bench.experiments.judge_backbone import BackboneRecipe, built_backbone
from bench.experiments.judge_capacity import lm_train
from bench.experiments.judge_format import ANALYSES, DRILLED, JUDGE_TEMPLATE, judge_answer
from bench.experiments.judge_grpo_eval import evaluate, evaluate_kept, kept_seed, outcome_prm
from bench.experiments.judge_heldout import write_processbench
from bench.experiments.neural_policy import POLICIES, add_policy_cache_option, policy_model
from bench.experiments.stats import random_guess_f1

# steps of different difficulty: an error rate per operation, for each range of numbers
OP_ERROR_RATES = {
    "default": {"Add": 0.05, "Subtract": 0.15, "Multiply by": 0.35},
    "small": {"Add": 0.05, "Subtract": 0.25},
}
RULES = {"abs-q": "abs-q", "rel-ratio": "rel-ratio:gamma=0.8", "rel-effective": "rel-effective:alpha=0.4"}


def base_judge(root: Path, train_rows: Sequence[dict[str, Any]], args: argparse.Namespace, seed: int) -> Path:
    """Pretrained on solutions, then the verdict format with random verdicts."""
    from stepq.trainer.tiny_model import build_tiny_llama, build_tiny_model
    from stepq.workers.backends.synthetic_policy import SyntheticPolicy, make_problem
    from stepq.workers.data.synthetic_set import NUMBERS
    from stepq.workers.seeds import derive_seed

    if args.analysis in DRILLED:  # the compact spelling's arithmetic, from drills mixed in
        if args.backbone != "llama":
            raise SystemExit(f"--analysis {args.analysis} needs the llama backbone")
        base = root / "base"
        recipe = BackboneRecipe(
            seed, args.layers, args.width, args.pretrain_problems, args.pretrain_steps, args.numbers,
            drills=args.pretrain_problems,
        )  # fmt: skip
        loss = built_backbone(base, recipe)["loss"]
        return _format_stage(root, base, loss, train_rows, args, seed)
    if args.backbone == "llama":
        base = build_tiny_llama(
            root / "base", seed=seed, max_positions=1024, hidden_size=args.width, num_layers=args.layers
        )
    else:
        base = build_tiny_model(root / "base", seed=seed, n_positions=1024, n_embd=args.width, n_layer=args.layers)
    policy = SyntheticPolicy(error_rate=0.0, recovery_rate=0.0)
    solutions = []
    for i in range(args.pretrain_problems):
        problem = make_problem(derive_seed("judge-grpo-pretrain", seed, i), numbers=NUMBERS[args.numbers])
        steps = policy.solve(problem, i)
        solutions.append((problem.question + "\n", "".join(s.text for s in steps)))
    loss = lm_train(base, solutions, args.pretrain_steps, 16, 1e-3, seed)
    return _format_stage(root, base, loss, train_rows, args, seed)


def _format_stage(
    root: Path, base: Path, loss: float, train_rows: Sequence[dict[str, Any]], args: argparse.Namespace, seed: int
) -> Path:
    shutil.copytree(base, root / "backbone")  # the pretrained LM, before the format: the PRM's backbone
    # every prompt with both verdicts in the same batch: the base learns the format and that
    # either verdict is as likely, whatever the prompt (a random verdict, with no drift)
    verdicts = [(r["prompt"], judge_answer(r, v, args.analysis)) for r in train_rows for v in ("Positive", "Negative")]
    fmt_loss = lm_train(base, verdicts, args.format_steps, 16, args.format_lr, seed + 1, group=2)
    print(f"  base judge: pretrain loss {loss:.3f}, random-verdict format loss {fmt_loss:.3f}", flush=True)
    return base


def prepare(seed: int, rule_name: str, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """Everything before GRPO: the annotated set and its snapshot, the held-out and tuning files,
    the base judge and its figures.  Recorded in ``prepared.json`` so that ``--reuse`` starts the
    next GRPO setting from the same base (the preparation is most of a short run)."""
    from stepq.embedded import annotate_in_process
    from stepq.migrations import upgrade
    from stepq.models import Database
    from stepq.models.snapshots import TRAIN, VALIDATION
    from stepq.trainer.generative_judge.prompt import JudgePrompt
    from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
    from stepq.trainer.snapshots.export import snapshot_records
    from stepq.workers.backends.synthetic_policy import SyntheticPolicy
    from stepq.workers.data.synthetic_set import synth_set

    started = time.perf_counter()
    run_dir.mkdir(parents=True)
    url = f"sqlite:///{run_dir / 'stepq.db'}"
    upgrade(url)
    db = Database(url)
    model = policy_model(args.policy, args.policy_cache, args.quick, run_dir.parent / "quick-policy")
    plan: dict[str, Any] = {}
    if model is None:
        synth_set(
            db,
            "judge",
            problems=args.problems,
            seed=seed,
            error_rate=0.15,
            recovery_rate=args.recovery_rate,
            op_error_rates=OP_ERROR_RATES[args.numbers],
            numbers=args.numbers,
        )
    else:  # the neural policy's own samples, rolled out by the same policy
        from bench.experiments.budget_neural import sample_policy

        plan = sample_policy(db, "judge", seed, args.problems, model)
    annotate_in_process(db, "judge", args.rollouts, worker="bench", rule=RULES[rule_name], **plan)
    spec = SnapshotSpec(
        ("judge",),
        RULES[rule_name],
        val_fraction=0.2,
        seed=seed,
        until_first_error=args.form == "first-dead",
        balance_by_position=args.balance == "position",
    )
    snapshot = create_snapshot(db, spec)
    (run_dir / "template.txt").write_text(JUDGE_TEMPLATE)
    records = snapshot_records(db, snapshot, JudgePrompt(JUDGE_TEMPLATE))
    policy = SyntheticPolicy(
        error_rate=0.15,
        recovery_rate=args.recovery_rate,
        op_error_rates=tuple(OP_ERROR_RATES[args.numbers].items()),
    )
    seen = frozenset(r["problem"] for part in records.values() for r in part)
    samples = write_processbench(run_dir / "heldout.json", args.heldout, seed, policy, seen, args.numbers)
    write_processbench(
        run_dir / "tune.json", args.heldout // 2, seed + 1000, policy, seen, args.numbers
    )  # thresholds only
    tune_rows = random.Random(seed).sample(records[TRAIN], min(300, len(records[TRAIN])))
    base = base_judge(run_dir, records[TRAIN], args, seed)
    # room for the longest answer the format stage taught (the character tokenizer: one token a character)
    completion = max(len(judge_answer(r, "Negative", args.analysis)) for part in records.values() for r in part)
    completion += 8 if args.analysis == "none" else 40  # an analysis of another problem may run longer
    files = (run_dir / "heldout.json", run_dir / "tune.json")
    before = evaluate(base, records[VALIDATION], tune_rows, *files, samples, seed, completion)
    prepared = {
        "snapshot": snapshot,
        "completion": completion,
        "tune_chunks": [r["chunk_id"] for r in tune_rows],
        "base": before,
        "settings": _preparation_settings(args),
        "prepare_s": round(time.perf_counter() - started),
    }
    (run_dir / "prepared.json").write_text(json.dumps(prepared))
    return prepared


def _preparation_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What a kept preparation was made with: ``--reuse`` refuses one made otherwise."""
    keys = ("problems", "rollouts", "recovery_rate", "numbers", "heldout", "backbone", "analysis", "form", "width",
            "layers", "pretrain_problems", "pretrain_steps", "format_steps", "format_lr", "balance",
            "policy")  # fmt: skip
    return {k: getattr(args, k) for k in keys}


def grpo_name(args: argparse.Namespace) -> str:
    """The GRPO run's folder, named by its settings: runs with other settings sit beside it."""
    extra = "" if args.top_entropy_quantile == 1.0 else f"-teq{args.top_entropy_quantile:g}"
    extra += "" if args.num_iterations == 1 else f"-mu{args.num_iterations}"
    return f"grpo-lr{args.lr:g}-beta{args.beta:g}-g{args.generations}x{args.prompts_per_step}-steps{args.steps}{extra}"


def supervised_judge(
    run_dir: Path, train_rows: Sequence[dict[str, Any]], args: argparse.Namespace, seed: int
) -> dict[str, Any]:
    """The same labels taught by cross-entropy (``stepq train --method sft``, as the capacity
    check's ``teach_verdict`` teaches) from the same pretrained backbone, for the same analysis:
    what GRPO's judge is measured against."""
    from bench.experiments.judge_capacity import teach_verdict

    started = time.perf_counter()
    model, loss = teach_verdict(
        run_dir / "backbone", run_dir / f"supervised-steps{args.supervised_steps}", train_rows, target="label",
        analysis=args.analysis, steps=args.supervised_steps, batch=16, lr=1e-3, seed=seed,
    )  # fmt: skip
    return {
        "model": model,
        "loss": loss,
        "steps": args.supervised_steps,
        "train_s": round(time.perf_counter() - started),
    }


def grpo_recipe(args: argparse.Namespace, run_dir: Path, completion: int, seed: int) -> Any:
    """The GRPO recipe a kept seed trains with (as ``stepq train`` reads one)."""
    from stepq.trainer.training.recipe import Recipe

    return Recipe.parse(
        f"""model: {run_dir / "base"}
rewards: [verdict-match]
judge_template: {run_dir / "template.txt"}
conversational: false
trainer:
  num_generations: {args.generations}
  per_device_train_batch_size: {args.generations * args.prompts_per_step}
  max_completion_length: {completion}
  max_steps: {args.steps}
  learning_rate: {args.lr}
  loss_type: grpo
  epsilon: 0.2
  epsilon_high: 0.28
  beta: {args.beta}
  top_entropy_quantile: {args.top_entropy_quantile}
  num_iterations: {args.num_iterations}
  temperature: 1.0
  disable_dropout: true
  gradient_checkpointing: false
  bf16: false
  logging_steps: 50
  save_steps: 100000
  use_cpu: {str(args.device == "cpu").lower()}
  seed: {seed}
"""
    )


def one_run(seed: int, rule_name: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from stepq.migrations import upgrade
    from stepq.models import Database
    from stepq.models.snapshots import TRAIN, VALIDATION
    from stepq.trainer import methods
    from stepq.trainer.training.runs import TrainOptions

    started = time.perf_counter()
    run_dir = root / f"seed{seed}-{rule_name}"
    kept = run_dir / "prepared.json"
    if args.reuse and kept.is_file():
        prepared = json.loads(kept.read_text())
        # kept before --balance or --policy: their defaults
        if {"balance": "overall", "policy": "synthetic", **prepared["settings"]} != _preparation_settings(args):
            raise SystemExit(f"--reuse: {run_dir} was prepared with {prepared['settings']}; these settings differ")
        print(f"  reusing the data and base judge in {run_dir}", flush=True)
    elif run_dir.exists():
        raise SystemExit(
            f"{run_dir} exists"
            + (" but its preparation never finished" if args.reuse else " (--reuse starts from it)")
            + ": remove it, or keep this run elsewhere"
        )
    else:
        prepared = prepare(seed, rule_name, args, run_dir)
    url = f"sqlite:///{run_dir / 'stepq.db'}"
    upgrade(url)
    db = Database(url)
    snapshot = prepared["snapshot"]
    kept_rows = kept_seed(db, run_dir, prepared)
    records, files, samples = kept_rows.records, kept_rows.files, kept_rows.samples
    print(f"  snapshot: {len(records[TRAIN])} training, {len(records[VALIDATION])} validation chunks", flush=True)
    recipe = grpo_recipe(args, run_dir, kept_rows.completion, seed)
    after, grpo_steps, train_s = None, 0, 0.0
    if args.steps:
        trained_at = time.perf_counter()
        data = methods.TrainingData(snapshot=str(snapshot))
        result = methods.train(db, "grpo", recipe, data, run_dir / grpo_name(args), TrainOptions())
        train_s = time.perf_counter() - trained_at
        after = evaluate_kept(result.final_model, kept_rows, seed)
        grpo_steps = result.global_step
    supervised = None
    if args.supervised_steps:
        supervised = supervised_judge(run_dir, records[TRAIN], args, seed)
        figures = evaluate_kept(supervised["model"], kept_rows, seed)
        supervised = {**supervised, **figures, "model": str(supervised["model"])}
    prm = outcome_prm(db, run_dir, files, samples, args, seed) if args.prm_steps else None
    return {
        "seed": seed,
        "rule": rule_name,
        "analysis": args.analysis,
        "form": args.form,
        "train_chunks": len(records[TRAIN]),
        "validation_chunks": len(records[VALIDATION]),
        "heldout_samples": len(samples),
        "random_guess_f1": random_guess_f1(samples, seed),
        "base": prepared["base"],
        "trained": after,
        "supervised": supervised,
        "prm": prm,
        "grpo_steps": grpo_steps,
        "train_s": round(train_s),
        "prepare_s": prepared["prepare_s"],
        "total_s": round(time.perf_counter() - started),
    }


def show(r: dict[str, Any]) -> None:
    def ci(v: float, lo_hi: Sequence[float]) -> str:
        return f"{v:5.1f} [{lo_hi[0]:5.1f}, {lo_hi[1]:5.1f}]"

    print(
        f"seed {r['seed']} {r['rule']}: {r['train_chunks']} training chunks, {r['grpo_steps']} GRPO steps in "
        f"{r['train_s']} s (run {r['total_s']} s; its data and base judge took {r['prepare_s']} s)"
    )
    header = f"{'balanced acc (val)':>24} {'ProcessBench F1 (held out)':>28} {'no verdict':>11} {'Positive':>9}"
    print(f"  {'judge':<10} {header} {'AUC of P(Positive)':>22}")
    judges = [name for name in ("base", "trained", "supervised") if r.get(name)]
    for name in judges:
        m = r[name]
        auc = ci(100 * m["p_positive_auc"], [100 * x for x in m["p_positive_auc_ci"]])
        print(
            f"  {name:<10} {ci(m['balanced_accuracy'], m['balanced_accuracy_ci']):>24} "
            f"{ci(m['processbench_f1'], m['processbench_f1_ci']):>28} {m['no_verdict']:>11} "
            f"{100 * m['positive_share']:>8.0f}% {auc:>22}"
        )
    print(f"  {'judge':<10} {'P(Positive) >= t: balanced acc':>32} {'ProcessBench F1 (t tuned elsewhere)':>36}")
    for name in judges:
        m = r[name]
        print(
            f"  {name:<10} {ci(m['thresholded_balanced_accuracy'], m['thresholded_balanced_accuracy_ci']):>32} "
            f"{ci(m['thresholded_processbench_f1'], m['thresholded_processbench_f1_ci']):>36}"
        )
    print("  mean P(Positive) on held-out steps by position (correct steps / first wrong steps):")
    for name in judges:
        rows = r[name]["p_positive_by_position"]
        cells = [
            f"{'-' if c is None else f'{c:.2f}'}/{'-' if w is None else f'{w:.2f}'}"
            for c, w in zip(rows["correct"], rows["first_error"], strict=True)
        ]
        print(f"  {name:<10} " + " ".join(cells))
    if r.get("prm"):
        p = r["prm"]
        print(
            f"  outcome PRM ({p['examples']} solutions, {p['steps']} steps, {p['train_s']} s): ProcessBench F1 "
            f"{ci(p['processbench_f1'], p['processbench_f1_ci'])} at threshold {p['threshold']:.3f} tuned elsewhere"
        )
    print(f"  chance: balanced accuracy 50.0, random first-error guess F1 {r['random_guess_f1']:.1f}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rules", default="abs-q", help=f"Comma-separated, of: {', '.join(RULES)}.")
    ap.add_argument("--problems", type=int, default=600, help="Training set problems (one trajectory each).")
    ap.add_argument("--rollouts", type=int, default=8, help="M, rollouts per prefix.")
    ap.add_argument("--recovery-rate", type=float, default=0.05)
    ap.add_argument(
        "--numbers",
        choices=["default", "small"],
        default="small",
        help="small: one-digit additions (error rate 5%%) and subtractions (25%%) from a two-digit start, so "
        "one digit of arithmetic checks a step (the backbone computes 97%% of them); default: the synthetic "
        "policy's numbers, with multiplications (add 5%%, subtract 15%%, multiply 35%%; the backbone computes "
        "37%% of step results after 3,000 steps).",
    )
    ap.add_argument(
        "--policy",
        choices=POLICIES,
        default="synthetic",
        help="Whose trajectories and rollouts are labelled: the synthetic policy, or a neural policy's strength "
        "(its own samples, small numbers).",
    )
    add_policy_cache_option(ap)
    ap.add_argument("--heldout", type=int, default=300, help="Held-out ProcessBench samples.")
    ap.add_argument(
        "--backbone",
        choices=["llama", "gpt2"],
        default="llama",
        help="llama: rotary positions, so the left padding of TRL's batches shifts nothing; gpt2's absolute "
        "positions move with it (TRL's training pass passes no position ids), and it did not learn here.",
    )
    ap.add_argument(
        "--analysis",
        choices=ANALYSES,
        default="none",
        help="none: the verdict alone; recompute: the format stage also teaches an analysis that redoes the "
        "judged step's arithmetic before the (random) verdict; resolve: one that re-solves the problem up to the "
        "judged step (tried: GRPO did not learn from it, see docs/experiments/judge_grpo.md).",
    )
    ap.add_argument(
        "--form",
        choices=["all", "first-dead"],
        default="all",
        help="all: every labelled chunk (StepWiser's snapshot); first-dead: each trajectory up to its first dead "
        "prefix (stepq snapshot create --until-first-error).",
    )
    ap.add_argument(
        "--balance", choices=["overall", "position"], default="overall", help="position: --balance-by-position."
    )
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--pretrain-problems", type=int, default=2000)
    ap.add_argument(
        "--pretrain-steps",
        type=int,
        default=3000,
        help="Enough that the backbone computes the steps (small numbers: 97%% of step results predicted "
        "whole after 3,000 steps, 8%% after 600).",
    )
    ap.add_argument(
        "--format-steps",
        type=int,
        default=1500,
        help="Long enough that the format is written without slips: a char model that misspells one verdict "
        "more often (Posive) hands GRPO a bias toward the other.",
    )
    ap.add_argument("--steps", type=int, default=300, help="GRPO steps (0: no GRPO run).")
    ap.add_argument(
        "--supervised-steps",
        type=int,
        default=0,
        help="Also teach the labels by cross-entropy from the same backbone for this many steps (16 rows a step "
        "at 1e-3, as bench_judge_capacity does), evaluated as the GRPO judge is (0: not).",
    )
    ap.add_argument("--generations", type=int, default=4, help="Per prompt (the paper's 4).")
    ap.add_argument("--prompts-per-step", type=int, default=16)
    ap.add_argument("--format-lr", type=float, default=1e-3)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument(
        "--beta",
        type=float,
        default=0.0,
        help="KL weight to the base (the shipped objective: 0; 0.1 kept the spelled judge's format at 1e-3).",
    )
    ap.add_argument(
        "--top-entropy-quantile",
        type=float,
        default=1.0,
        help="TRL's: the loss on this share of the most uncertain tokens only (1.0: every token, as shipped).",
    )
    ap.add_argument(
        "--num-iterations",
        type=int,
        default=1,
        help="TRL's num_iterations (the GRPO paper's mu): optimisation passes over each generated batch (1 as "
        "shipped).",
    )
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="Where GRPO trains (float32 either way: the same objective and precision, not the same draws, which "
        "CPU and CUDA sample differently); the judges are evaluated on CUDA whenever one is present.",
    )
    ap.add_argument("--prm-steps", type=int, default=1000, help="The outcome PRM's steps (0: no PRM).")
    ap.add_argument("--prm-lr", type=float, default=1e-3)
    ap.add_argument("--quick", action="store_true", help="Tiny sizes: checks the chain runs, measures nothing.")
    ap.add_argument("--keep", type=Path, default=None, help="Keep the databases and models here.")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="With --keep: a seed whose data and base judge are already there (made with the same data, backbone "
        "and format settings) starts GRPO from them; each GRPO setting trains into its own folder.",
    )
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.quick:
        args.problems, args.heldout, args.pretrain_steps, args.format_steps = 60, 16, 60, 30
        # shrunk, never switched on: --steps 0 or --prm-steps 0 stay off
        args.steps, args.prm_steps = min(args.steps, 6), min(args.prm_steps, 10)
        args.pretrain_problems = 200
    if args.reuse and not args.keep:
        raise SystemExit("--reuse needs --keep DIR (where the prepared seeds are kept)")
    if args.policy != "synthetic" and args.numbers != "small":
        raise SystemExit(f"--policy {args.policy} writes small-number solutions only: use --numbers small")
    seeds = [int(s) for s in args.seeds.split(",")]
    rules = [r.strip() for r in args.rules.split(",")]
    unknown = [r for r in rules if r not in RULES]
    if unknown:
        raise SystemExit(f"unknown rule(s) {unknown}; one of {list(RULES)}")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        for rule in rules:
            for seed in seeds:
                print(f"== seed {seed}, rule {rule}", flush=True)
                r = one_run(seed, rule, args, root)
                show(r)
                results.append(r)
    emit({"benchmark": "judge_grpo", "args": {k: str(v) for k, v in vars(args).items()}, "runs": results})


if __name__ == "__main__":
    main()
