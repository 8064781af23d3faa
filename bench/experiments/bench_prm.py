"""A discriminative PRM trained from outcome labels alone, on the synthetic policy, where the
truth of every step is known.

Training sees only (problem, steps, final answer right?), by default the paper's data: the
policy's responses to each question (``--samples`` of them), of questions whose responses are
right 20-80% of the time (``--pass-rate``, ``off`` to keep every question).
``--prefix-rollouts R`` adds R rollouts from each later prefix of each response as extra
solutions (stepq's option; the pass rate still counts the responses only).  ``--aggregate
last`` trains the outcome reward model (ORM) on the same backbone and data: the paper's
baseline, scored by what it says after each step.  ``--supervision steps`` trains on
every step's true label instead, the upper bound that tells a backbone unable to check the
arithmetic from outcome labels unable to teach it.  On held-out problems the benchmark
asks whether the PRM's step scores rank wrong steps below right ones (ROC AUC with a 95%
problem-level bootstrap interval), against two baselines that need no model: the step's
position (later steps are more often wrong) and AUC within each step position (the model
must read the arithmetic, not count steps).  Then Best-of-N against random choice, choosing by
the PRM's min step score and by the geometric mean of its step scores.

    OMP_NUM_THREADS=1 python -m bench.experiments.bench_prm [--seed 0] [--steps 12000] [--backbone-dir DIR]

The defaults, but for the data (the paper's filter became the default later: those runs are
``--pass-rate off``), are the README's headline runs (10,000 training problems, none of them a test
problem, and a short-first curriculum of 3,000 steps on one-step solutions, 12,000 steps in
all; 70-96 min with one thread beside another run): seeds 0 and 2 learn the check, seed 1
does not.  The README's table gives the flags of every other run.  When the outcome loss
starts to fall varies between seeds and between runs of one seed on different thread counts,
so compare seeds, not single runs.

A tiny GPT-2 or Llama is built locally (random init, character tokenizer), optionally
pretrained as a language model on correct solutions (``--pretrain-steps``), then trained by
``stepq.trainer.prm`` (both on CUDA when present), its run recorded in a throwaway SQLite
database.  The README lists the runs and their commands.
Prints a table, then one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import emit
from bench.experiments.lm_training import fit_causal_lm
from bench.experiments.stats import auc, bootstrap
from stepq.migrations import upgrade
from stepq.models import Database
from stepq.trainer.evaluation.best_of_n import pick
from stepq.trainer.outcomes.export import PAPER_PASS_RATE, OutcomeFilter
from stepq.trainer.prm.aggregate import AGGREGATES
from stepq.trainer.prm.model import StepScorer
from stepq.trainer.prm.step_labels import StepExample
from stepq.trainer.prm.train import OutcomeExample
from stepq.trainer.tiny_model import build_tiny_llama, build_tiny_model
from stepq.trainer.training.recipe import Recipe
from stepq.workers.backends.synthetic_policy import (
    DEFAULT_NUMBERS,
    SMALL_NUMBERS,
    Numbers,
    SyntheticPolicy,
    ground_truth,
    make_problem,
    parse_problem,
)
from stepq.workers.seeds import derive_seed

Step = tuple[int, float, bool]  # (position, score, right)

# Best-of-N selections reported: the min step score (a solution is as good as its weakest
# step), and the geometric mean, the default aggregate the PRM's outcome loss is trained on.
SELECTIONS = ("min", "geomean", "last")
"""``last``: the score after the last step, how an ORM picks."""


def step_auc(problems: Sequence[Sequence[Step]], by_position: bool = False) -> float:
    """AUC over all steps, or the pair-weighted mean of the AUCs within each step position."""
    steps = [s for p in problems for s in p]
    if not by_position:
        return auc([s for _, s, r in steps if r], [s for _, s, r in steps if not r])
    total = weight = 0.0
    for pos in {p for p, _, _ in steps}:
        pos_ = [s for p, s, r in steps if p == pos and r]
        neg = [s for p, s, r in steps if p == pos and not r]
        if pos_ and neg:
            total += auc(pos_, neg) * len(pos_) * len(neg)
            weight += len(pos_) * len(neg)
    return total / weight if weight else float("nan")


def solutions(
    policy: SyntheticPolicy,
    problems: int,
    samples: int,
    tag: str,
    seed: int,
    lengths: tuple[int, int],
    numbers: Numbers = DEFAULT_NUMBERS,
    exclude: frozenset[str] = frozenset(),
) -> list[list[tuple]]:
    """``problems`` problems with ``samples`` solutions each, skipping (and drawing past) any
    whose question is in ``exclude``: only 558 one-step problems exist in small numbers, so a
    training set drawn without it holds many of the test set's short problems."""
    out: list[list[tuple]] = []
    for draw in itertools.count():
        if len(out) == problems:
            break
        problem = make_problem(derive_seed(tag, seed, draw), *lengths, numbers=numbers)
        if problem.question in exclude:
            continue
        group = []
        for j in range(samples):
            # Solution j of draw k is seeded by (k + 1, j): how the README's held-out runs were drawn.
            steps = policy.solve(problem, derive_seed(tag, seed, draw + 1, j))
            group.append(
                (problem.question, [s.text for s in steps], ground_truth(steps), steps[-1].value == problem.answer)
            )
        out.append(group)
    return out


def within_pass_rate(groups: Sequence[Sequence[tuple]], bounds: tuple[float, float] | None) -> list[list[tuple]]:
    """The problems whose responses are right at a rate in ``bounds`` (all with None): the
    paper's question filter, over the responses to the question."""
    if bounds is None:
        return [list(g) for g in groups]
    lo, hi = bounds
    return [list(g) for g in groups if lo <= sum(r[3] for r in g) / len(g) <= hi]


def prefix_rollouts(policy: SyntheticPolicy, groups: Sequence[Sequence[tuple]], per_prefix: int, seed: int) -> list:
    """``per_prefix`` rollouts from every prefix k = 1 .. n-1 of every response: its first k
    steps, then the policy's continuation, with the continuation's outcome (what stepq's
    ``--prefix-rollouts`` export adds).  Each is (question, steps, truth, right)."""
    out = []
    for g, group in enumerate(groups):
        for r, (question, steps, truth, _) in enumerate(group):
            problem = parse_problem(f"Problem: {question}")
            for k in range(1, len(steps)):
                value = int(steps[k - 1].rsplit("= ", 1)[1].split(".")[0])
                for j in range(per_prefix):
                    rng = random.Random(derive_seed("prm-prefix", seed, g, r, k, j))
                    rest = policy.continue_steps(problem, k, value, rng)
                    ok = truth[k - 1]
                    rest_truth = []
                    for step in rest:
                        ok = ok and step.correct and not step.slip
                        rest_truth.append(ok)
                    out.append(
                        (
                            question,
                            steps[:k] + [st.text for st in rest],
                            truth[:k] + rest_truth,
                            rest[-1].value == problem.answer,
                        )
                    )
    return out


def pretrain(base: Path, texts: Sequence[tuple[str, list[str]]], steps: int, batch_size: int, seed: int) -> float:
    """Next-token training of the backbone on correct solutions, as a real PRM starts from a
    language model that can already do the arithmetic it will judge.  The loss is on the
    solution only (the question's numbers cannot be predicted).  Returns the final loss."""
    from transformers import AutoTokenizer

    from stepq.trainer.prm.model import encode

    tokenizer = AutoTokenizer.from_pretrained(base)
    encoded = []
    for question, solution in texts:
        e = encode(tokenizer, question, solution, 512)
        start = len(encode(tokenizer, question, [], 512).ids)
        encoded.append((e.ids, start))
    return fit_causal_lm(base, encoded, steps, batch_size, seed)


def backbone(
    args: argparse.Namespace, root: Path, lengths: tuple[int, int], numbers: Numbers, held_out: frozenset[str]
) -> tuple[Path, float | None]:
    """The PRM's language model: built with random weights, then pretrained when asked.  With
    ``--backbone-dir`` it is kept, and a later run with the same backbone flags reuses it
    (a different backbone there is refused rather than silently used)."""
    recipe = {
        k: getattr(args, k)
        for k in ("backbone", "width", "layers", "heads", "pretrain_steps", "pretrain_problems", "batch_size", "seed")
    } | {
        "lengths": list(lengths),
        "numbers": args.numbers,
        "held_out_test_problems": args.test_problems,
    }
    base = args.backbone_dir or root / "base"
    kept = base / "bench_backbone.json"
    if kept.is_file():
        stored = json.loads(kept.read_text())
        if stored["recipe"] != recipe:
            raise SystemExit(f"{base} holds another backbone ({stored['recipe']}); pick another --backbone-dir")
        print(f"backbone: reusing {base}")
        return base, stored["pretrain_loss"]
    if args.backbone == "llama":
        build_tiny_llama(base, seed=args.seed, max_positions=512, hidden_size=args.width, num_layers=args.layers)
    else:
        build_tiny_model(
            base, seed=args.seed, n_positions=512, n_embd=args.width, n_layer=args.layers, n_head=args.heads
        )
    pretrain_loss = None
    if args.pretrain_steps:
        correct = SyntheticPolicy(error_rate=0.0, recovery_rate=0.0)
        texts = [
            (question, steps)
            for group in solutions(
                correct, args.pretrain_problems, 1, "prm-pretrain", args.seed, lengths, numbers, held_out
            )
            for question, steps, _, _ in group
        ]
        started = time.perf_counter()
        pretrain_loss = pretrain(base, texts, args.pretrain_steps, args.batch_size * 2, args.seed)
        print(f"pretraining: {args.pretrain_steps} steps, {time.perf_counter() - started:.0f} s")
    kept.write_text(json.dumps({"recipe": recipe, "pretrain_loss": pretrain_loss}))
    return base, pretrain_loss


def prm_run(
    base: Path, examples: Sequence[OutcomeExample] | Sequence[StepExample], root: Path, args: argparse.Namespace
) -> tuple:
    """stepq's PRM trainer (``methods.train``, what ``stepq train --method prm`` runs) on
    outcome or step examples, its run recorded in a throwaway SQLite database: what is
    benchmarked.  Returns the trained scorer and its step count."""
    from stepq.models import queries
    from stepq.trainer import methods
    from stepq.trainer.training.runs import TrainOptions

    recipe = Recipe.parse(
        f"method: prm\nmodel: {base}\ntrainer:\n  aggregate: {args.aggregate}\n  head: {args.head}\n"
        f"  learning_rate: {args.learning_rate}\n"
        f"  weight_decay: {args.weight_decay}\n  warmup_steps: {args.warmup_steps}\n"
        + (f"  max_grad_norm: {args.max_grad_norm}\n" if args.max_grad_norm else "")
        + f"  curriculum_steps: {args.curriculum_steps}\n"
        f"  curriculum_max_solution_steps: {args.curriculum_max_solution_steps}\n"
        + f"  batch_size: {args.batch_size}\n  epochs: 1000\n  max_steps: {args.steps}\n  save_steps: {args.steps}\n"
        f"  logging_steps: 50\n  seed: {args.seed}\n"
    )
    upgrade(f"sqlite:///{root / 'runs.db'}")
    db = Database(f"sqlite:///{root / 'runs.db'}")
    name = f"synthetic-{args.supervision}"
    result = methods.train(
        db, "prm", recipe, methods.TrainingData(records=list(examples), name=name), root / "run", TrainOptions()
    )
    with db.session() as session:
        logged = [
            (m.step, m.loss, m.accuracy_positive, m.accuracy_negative)
            for m in queries.run_metrics(session, result.run_id)
        ]
    for step, loss, acc_pos, acc_neg in logged[:: max(1, len(logged) // 8)] + logged[-1:]:
        print(f"  step {step:>5}  loss {loss:.4f}  accuracy +{acc_pos or 0:.2f} -{acc_neg or 0:.2f}")
    return StepScorer.load(result.final_model), result.global_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-problems", type=int, default=10000)
    ap.add_argument("--samples", type=int, default=8, help="Solutions per training problem.")
    ap.add_argument("--test-problems", type=int, default=150)
    ap.add_argument("--n", type=int, default=8, help="Candidates per test problem (Best-of-N).")
    ap.add_argument("--error-rate", type=float, default=0.25)
    ap.add_argument(
        "--numbers",
        choices=["default", "small"],
        default="small",
        help="small: one-digit additions and subtractions (synthetic_policy.SMALL_NUMBERS)",
    )
    ap.add_argument("--min-ops", type=int, default=1)
    ap.add_argument("--max-ops", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12000, help="Training steps.")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--learning-rate", type=float, default=1e-4)
    ap.add_argument(
        "--weight-decay",
        type=float,
        default=0.0,
        help="The PRM trainer's AdamW weight decay (each step shrinks weights by learning rate x this)",
    )
    ap.add_argument("--warmup-steps", type=int, default=0, help="The PRM trainer's linear learning-rate warmup")
    ap.add_argument("--max-grad-norm", type=float, default=0.0, help="Clip the PRM trainer's gradient norm (0: off)")
    ap.add_argument(
        "--curriculum-steps",
        type=int,
        default=3000,
        help="The PRM trainer's short-first curriculum: this many steps on short solutions first",
    )
    ap.add_argument(
        "--curriculum-max-solution-steps",
        type=int,
        default=1,
        help="What the curriculum counts as short: solutions of at most this many steps",
    )
    ap.add_argument(
        "--aggregate",
        default="geomean",
        choices=AGGREGATES,
        help="last: the outcome reward model (ORM), the paper's baseline, on the same backbone and data",
    )
    ap.add_argument(
        "--pass-rate",
        default=":".join(str(x) for x in PAPER_PASS_RATE),
        metavar="LOW:HIGH|off",
        help="Keep training problems whose --samples responses are right at a rate in [LOW, HIGH] "
        "(the paper's); off: every problem",
    )
    ap.add_argument(
        "--prefix-rollouts",
        type=int,
        default=0,
        metavar="R",
        help="R rollouts from each later prefix of each training response, as extra solutions (stepq's option)",
    )
    ap.add_argument(
        "--supervision",
        choices=["outcomes", "steps"],
        default="outcomes",
        help="steps: train on every step's true label instead (the upper bound; no run is recorded)",
    )
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument(
        "--head",
        choices=["linear", "mlp"],
        default="linear",
        help="The scoring head: the benchmark's recorded runs used linear (the trainer's default is mlp, the paper's).",
    )
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument(
        "--backbone", choices=["gpt2", "llama"], default="llama", help="llama: rotary positions, head dimension 64"
    )
    ap.add_argument(
        "--pretrain-steps",
        type=int,
        default=2000,
        help="Next-token steps on correct solutions of other problems before the PRM is trained.",
    )
    ap.add_argument("--pretrain-problems", type=int, default=4000)
    ap.add_argument(
        "--backbone-dir",
        type=Path,
        help="Keep the built (and pretrained) backbone here, or reuse the one already here: runs that "
        "differ only after pretraining then share it",
    )
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    lengths = (args.min_ops, args.max_ops)
    numbers = SMALL_NUMBERS if args.numbers == "small" else DEFAULT_NUMBERS
    policy = SyntheticPolicy(error_rate=args.error_rate, recovery_rate=0.0)
    test = solutions(policy, args.test_problems, args.n, "prm-test", args.seed, lengths, numbers)
    held_out = frozenset(group[0][0] for group in test)
    drawn = solutions(policy, args.train_problems, args.samples, "prm-train", args.seed, lengths, numbers, held_out)
    kept = within_pass_rate(drawn, OutcomeFilter.parse_pass_rate(args.pass_rate))
    train = [ex for group in kept for ex in group]
    if args.prefix_rollouts:
        train += prefix_rollouts(policy, kept, args.prefix_rollouts, args.seed)
    if not train:
        raise SystemExit(f"no training problem has a pass rate in {args.pass_rate}")
    examples = [OutcomeExample(q, tuple(steps), outcome) for q, steps, _, outcome in train]

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base, pretrain_loss = backbone(args, root, lengths, numbers, held_out)
        started = time.perf_counter()
        if args.supervision == "steps":
            # The upper bound outcome supervision aims at: the same backbone and head trained on
            # every step's true label (the step-label PRM on the truth).  When even this stays at
            # chance, the backbone cannot check the arithmetic, and outcomes cannot teach it.
            truths = [StepExample(q, tuple(steps), tuple(map(float, truth))) for q, steps, truth, _ in train]
            scorer, global_step = prm_run(base, truths, root, args)
        else:
            scorer, global_step = prm_run(base, examples, root, args)
        train_s = time.perf_counter() - started
        flat = [c for group in test for c in group]
        scores = scorer.score([(q, steps) for q, steps, _, _ in flat])

    per_problem: list[list[Step]] = []
    position: list[list[Step]] = []
    picks = dict.fromkeys(SELECTIONS, 0.0)
    picks_random = 0.0
    it = iter(scores)
    for group in test:
        steps_here: list[Step] = []
        pos_here: list[Step] = []
        candidates = []
        for _, _, truth, _ in group:
            s = [x if x is not None else 0.0 for x in next(it)]
            candidates.append(s)
            steps_here += [(i, v, t) for i, (v, t) in enumerate(zip(s, truth, strict=True))]
            pos_here += [(i, -float(i), t) for i, t in enumerate(truth)]
        per_problem.append(steps_here)
        position.append(pos_here)
        for how in SELECTIONS:
            picks[how] += group[pick(candidates, how)][3]
        picks_random += sum(c[3] for c in group) / len(group)

    def within(ps: Sequence[Sequence[Step]]) -> float:
        return step_auc(ps, by_position=True)

    result_auc = step_auc(per_problem)
    ci = bootstrap(per_problem, step_auc, args.seed, args.bootstrap)
    within_auc = within(per_problem)
    within_ci = bootstrap(per_problem, within, args.seed, args.bootstrap)
    baseline = step_auc(position)
    k = len(test)
    right_steps = sum(t for p in per_problem for _, _, t in p)
    wrong_steps = sum(not t for p in per_problem for _, _, t in p)
    print(f"training problems: {len(kept)} of {len(drawn)} drawn (pass rate {args.pass_rate})")
    print(
        f"training: {len(examples)} outcome-labelled solutions "
        f"({100 * sum(e.outcome for e in examples) / len(examples):.1f}% right), "
        f"{global_step} steps ({args.supervision} supervision), {train_s:.0f} s"
    )
    print(f"test: {k} problems x {args.n} solutions, {right_steps} right and {wrong_steps} wrong steps")
    print(f"{'step AUC (PRM)':<34} {result_auc:.3f}  95% CI [{ci[0]:.3f}, {ci[1]:.3f}]")
    print(f"{'step AUC within position (PRM)':<34} {within_auc:.3f}  95% CI [{within_ci[0]:.3f}, {within_ci[1]:.3f}]")
    print(f"{'step AUC (position only)':<34} {baseline:.3f}")
    for how in SELECTIONS:
        print(f"{'Best-of-' + str(args.n) + ' accuracy, PRM (' + how + ')':<34} {100 * picks[how] / k:.1f}%")
    print(f"{'Best-of-' + str(args.n) + ' accuracy, random':<34} {100 * picks_random / k:.1f}%")
    emit(
        {
            "auc": result_auc,
            "auc_ci": list(ci),
            "auc_within_position": within_auc,
            "auc_within_position_ci": list(within_ci),
            "auc_position_baseline": baseline,
            "best_of_n": args.n,
            "best_of_n_prm": 100 * picks["min"] / k,
            "best_of_n_prm_geomean": 100 * picks["geomean"] / k,
            "best_of_n_random": 100 * picks_random / k,
            "best_of_n_last": 100 * picks["last"] / k,
            "train_solutions": len(examples),
            "train_problems": args.train_problems,
            "train_problems_kept": len(kept),
            "pass_rate": args.pass_rate,
            "prefix_rollouts": args.prefix_rollouts,
            "aggregate": args.aggregate,
            "train_steps": global_step,
            "supervision": args.supervision,
            "train_seconds": train_s,
            "pretrain_steps": args.pretrain_steps,
            "pretrain_loss": pretrain_loss,
            "weight_decay": args.weight_decay,
            "warmup_steps": args.warmup_steps,
            "max_grad_norm": args.max_grad_norm,
            "curriculum_steps": args.curriculum_steps,
            "curriculum_max_solution_steps": args.curriculum_max_solution_steps,
            "learning_rate": args.learning_rate,
        }
    )


if __name__ == "__main__":
    main()
