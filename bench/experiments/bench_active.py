"""Active learning: judge quality per rollout spent, under each priority strategy.

    OMP_NUM_THREADS=1 python -m bench.experiments.bench_active \
        [--seeds 0 1 2 3 4] [--pool 8000] [--budget 40000] [--rounds 8] [--judge digit-mlp|prm]

For each seed, one pool of trajectories from the synthetic policy (recovery on, steps of
different difficulty: a multiplication goes wrong 6x as often as an addition) several times
larger than the rollout budget.  Each strategy annotates the same pool in rounds through the
real queue code (``stepq annotate --priority``'s path: a priority round, its scoring jobs run
by the embedded worker, rollout work dispatched in priority order, Monte Carlo labels by the
real task code, SQLite), stopping each round at its share of the budget.  After each round a
judge is trained on every label so far and scored on the same held-out synthetic ProcessBench
file (fresh problems, truth from the policy): step AUC (its chunk scores against each chunk's
truth) and ProcessBench F1 at threshold 0.5.  The first round is random for every strategy
(there is no judge yet); from the second on, each orders the waiting trajectories by the
judge the previous round trained.

The judge (``--judge``): ``digit-mlp``, a stand-in named so, a small MLP reading each step's
numbers digit by digit, trained from scratch in seconds (a chunk's score is the lowest of its
steps' so far); or ``prm``, stepq's own discriminative PRM trained on the set's Monte Carlo
labels each round and loaded by the worker's judge factory (``active_prm.py``); or ``sft``, the
spelled generative judge taught the labels by ``--method sft`` each round (``active_sft.py``,
on small numbers, its range).  On 2 CPU cores the PRM trains for minutes a round and does not
learn the check within them; the sft judge did not learn from the few hundred rows a
3,200-rollout budget's rounds hold (one GPU run), and learns at ``--pool 4000 --budget 40000
--rounds 4`` (about 1.6 h a seed of three arms on one core; docs/experiments/active.md), where
ordering by PRM800K's ``convincing-wrong`` reached random order's full-budget quality with less
than half the rollouts on three seeds, and its mirrored variant did not.

Prints a table per round, the headline (rollouts each strategy needs to reach the quality
``random`` reaches with the whole budget), writes the learning curves as a PNG (``--plot``,
needs matplotlib) and one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, text

from bench.common import emit, saved_result
from bench.experiments import active_picks, active_prm, active_sft, active_standin
from bench.experiments.active_standin import DigitJudge
from bench.experiments.judge_heldout import write_processbench
from bench.experiments.lm_training import Device
from bench.experiments.stats import mean_ci, processbench_f1, rank_auc
from stepq.assembly import worker_runtime
from stepq.migrations import upgrade
from stepq.models import Database, Rollout
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.backends.synthetic_policy import SyntheticPolicy
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions

ARMS = {
    "random": ("random", ""),
    "uncertainty": ("uncertainty", ""),
    "convincing-wrong": ("convincing-wrong", ""),
    "convincing-wrong-mirror": ("convincing-wrong", ",mirror=yes"),
}
"""Each arm's priority strategy and options beyond its judge (``--priority NAME:run=N...``)."""
DEFAULT_ARMS = ("random", "uncertainty", "convincing-wrong")
MIRRORED_BEFORE = "convincing-wrong-mirror"
"""What a run saved before the arms were recorded called ``convincing-wrong``: the strategy
had its mirror then (migration 0021)."""
OP_ERROR_RATES = {
    "default": {"Add": 0.05, "Subtract": 0.1, "Multiply by": 0.3},
    "small": {"Add": 0.05, "Subtract": 0.25},  # the spelled judge's range (its drills' numbers)
}


def policy(numbers: str) -> dict[str, Any]:
    """The pool's synthetic policy (``synth_set``'s arguments) on ``numbers``."""
    return {"error_rate": 0.1, "recovery_rate": 0.05, "op_error_rates": OP_ERROR_RATES[numbers], "numbers": numbers}


# --- evaluation --------------------------------------------------------------------------


def evaluate(judge: DigitJudge, heldout: Sequence[dict[str, Any]]) -> dict[str, float]:
    scores = judge.score_solutions([(s["problem"], s["steps"]) for s in heldout])
    rows, pairs = [], []
    for i, (sample, chunk_scores) in enumerate(zip(heldout, scores, strict=True)):
        label = sample["label"]
        for k, p in enumerate(chunk_scores):
            rows.append((i, label == -1 or k < label, float(p if p is not None else 1.0)))
        first = next((k for k, p in enumerate(chunk_scores) if p is not None and p < judge.threshold), -1)
        pairs.append((label, first))
    return {"step_auc": rank_auc(rows), "processbench_f1": processbench_f1(pairs)}


# --- one arm: a strategy on one seed's pool ----------------------------------------------


def rollouts_spent(db: Database) -> int:
    with db.session() as s:
        return int(s.scalar(select(func.count(Rollout.id))) or 0)


def run_arm(
    strategy: str, seed: int, root: Path, heldout: Sequence[dict[str, Any]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    url = f"sqlite:///{root}/{strategy}.db"
    upgrade(url)
    db = Database(url)
    synth_set(db, "pool", problems=args.pool, seed=seed, **policy(args.numbers))
    configure_annotation(db, "pool", args.rollouts, priority=f"random:seed={seed}")
    judges: dict[int, DigitJudge] = {}
    runtime = worker_runtime(
        db,
        WorkerOptions(batch_rollouts=256, name="bench"),
        # stepq's judges (prm, sft) are scored by the worker's own factory (the run's saved model)
        judge_factory=(lambda run_id, _strategy: judges[run_id]) if args.judge == "digit-mlp" else None,
    )
    prm, sft = prm_settings(args), sft_settings(args)
    device = Device(args.device)  # the sft judge's pretraining and teaching (float32); its answers: CUDA if any
    base = None
    if args.judge == "prm":
        base = active_prm.build_backbone(root, prm, seed)
    elif args.judge == "sft":
        base = active_sft.build_backbone(root, sft, seed, device)
    previous: Path | None = None
    scoring = f",{active_sft.SCORE}" if args.judge == "sft" else ""
    curve = []
    seen: set[int] = set()
    try:
        for k in range(1, args.rounds + 1):
            target = args.budget * k // args.rounds
            started = time.perf_counter()
            run_in_process(db, runtime, stop=lambda t=target: rollouts_spent(db) >= t)  # type: ignore[misc]
            annotate_s = time.perf_counter() - started
            picked, seen = active_picks.round_picks(db, seen)
            started = time.perf_counter()
            out = root / f"{strategy}-r{k}"
            judge: Any
            if args.judge == "prm":
                assert base is not None
                solutions = active_prm.labelled_solutions(db)
                run_id = active_prm.round_judge(db, base, previous, solutions, out, prm, seed)
                judge = active_prm.load_judge(db, run_id)
                previous = active_prm.final_model(db, run_id)
                steps = sum(len(labels) for _, _, labels in solutions)
            elif args.judge == "sft":
                assert base is not None
                rows = active_sft.round_rows(db, "pool", seed, k)
                run_id = active_sft.round_judge(db, base, rows, sft, seed, device)
                judge = active_sft.load_judge(db, run_id)
                steps = len(rows)
            else:
                run_id, judges[run_id], steps = active_standin.round_judge(db, root, out, seed, args.epochs)
                judge = judges[run_id]
            train_s = time.perf_counter() - started
            point = {
                "round": k,
                "rollouts": rollouts_spent(db),
                "labelled_steps": steps,
                "annotate_s": annotate_s,
                "train_s": train_s,
                **evaluate(judge, heldout),
                "eval_s": time.perf_counter() - started - train_s,
                "picked": picked,
            }
            curve.append(point)
            print(
                f"  seed {seed} {strategy:>16} round {k}: {point['rollouts']:>6} rollouts, "
                f"{steps:>5} steps, AUC {point['step_auc']:.3f}, F1 {point['processbench_f1']:.1f} "
                f"(judge trained in {point['train_s']:.0f} s)",
                flush=True,
            )
            if strategy != "random" and k < args.rounds:
                name, options = ARMS[strategy]
                configure_annotation(db, "pool", args.rollouts, priority=f"{name}:run={run_id}{options}{scoring}")
    finally:
        runtime.close()
        db.engine.dispose()
    return curve


def sft_settings(args: argparse.Namespace) -> active_sft.SFTSettings:
    return active_sft.SFTSettings(
        pretrain_steps=args.sft_pretrain_steps, steps=args.sft_steps, batch=args.sft_batch, lr=args.sft_lr
    )


def prm_settings(args: argparse.Namespace) -> active_prm.PRMSettings:
    return active_prm.PRMSettings(
        width=args.prm_width,
        layers=args.prm_layers,
        steps=args.prm_steps,
        lr=args.prm_lr,
        warm_start=args.prm_warm_start,
    )


# --- summaries ---------------------------------------------------------------------------


def rollouts_to_reach(curve: Sequence[dict[str, Any]], metric: str, target: float) -> float | None:
    """Rollouts at which the curve first reaches ``target`` (linear between rounds; the
    first round from zero); None: never within the budget."""
    prev_x, prev_y = 0.0, None
    for p in curve:
        x, y = float(p["rollouts"]), float(p[metric])
        if y >= target:
            if prev_y is None or prev_y >= target:
                return x
            return prev_x + (x - prev_x) * (target - prev_y) / (y - prev_y)
        prev_x, prev_y = x, y
    return None


def headline(results: dict[str, dict[int, list[dict[str, Any]]]], metric: str) -> dict[str, Any]:
    """Per seed, the quality ``random`` reaches with the whole budget on that seed's pool, and
    the rollouts each strategy needs to reach it there (paired: the same pool and held-out
    file), as a share of the budget; None where a strategy never reaches it.  A seed random
    order was not run on has no target and is left out."""
    targets = {seed: curve[-1][metric] for seed, curve in results["random"].items()}
    out: dict[str, Any] = {"targets": targets}
    for strategy, by_seed in results.items():
        needed = {
            seed: rollouts_to_reach(curve, metric, targets[seed]) for seed, curve in by_seed.items() if seed in targets
        }
        shares = {seed: None if v is None else v / by_seed[seed][-1]["rollouts"] for seed, v in needed.items()}
        reached = [v for v in shares.values() if v is not None]
        out[strategy] = {
            "rollouts_per_seed": needed,
            "share_per_seed": shares,
            "reached": f"{len(reached)}/{len(shares)}",
            "mean_share_where_reached": statistics.mean(reached) if reached else None,
        }
    return out


def plot(results: dict[str, dict[int, list[dict[str, Any]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric, label in ((axes[0], "step_auc", "step AUC"), (axes[1], "processbench_f1", "ProcessBench F1")):
        for strategy, by_seed in results.items():
            curves = list(by_seed.values())
            xs = [statistics.mean(c[k]["rollouts"] for c in curves) for k in range(len(curves[0]))]
            stats = [mean_ci([c[k][metric] for c in curves]) for k in range(len(curves[0]))]
            ax.plot(xs, [m for m, _, _ in stats], marker="o", label=strategy)
            ax.fill_between(xs, [lo for _, lo, _ in stats], [hi for _, _, hi in stats], alpha=0.2)
        ax.set_xlabel("rollouts spent")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"held-out judge quality per rollout (mean and 95% interval over {len(curves)} seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--pool", type=int, default=8000, help="Trajectories waiting (one per problem).")
    ap.add_argument("--budget", type=int, default=40000, help="Rollouts in all, over every round.")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--rollouts", type=int, default=4, help="M, rollouts per prefix.")
    ap.add_argument("--heldout", type=int, default=300, help="Held-out ProcessBench samples.")
    ap.add_argument("--epochs", type=int, default=1000, help="The stand-in judge's full-batch training steps.")
    ap.add_argument(
        "--judge",
        choices=["digit-mlp", "prm", "sft"],
        default="digit-mlp",
        help="digit-mlp: the stand-in; prm: stepq's discriminative PRM on the Monte Carlo labels (active_prm.py); "
        "sft: stepq's spelled generative judge taught the labels by --method sft (active_sft.py)",
    )
    ap.add_argument(
        "--numbers",
        choices=sorted(OP_ERROR_RATES),
        default=None,
        help="The pool's numbers (default: small for --judge sft, the spelled judge's range; else default).",
    )
    ap.add_argument("--sft-pretrain-steps", type=int, default=active_sft.SFTSettings.pretrain_steps)
    ap.add_argument("--sft-steps", type=int, default=active_sft.SFTSettings.steps, help="Teaching steps a round.")
    ap.add_argument("--sft-batch", type=int, default=active_sft.SFTSettings.batch)
    ap.add_argument("--sft-lr", type=float, default=active_sft.SFTSettings.lr)
    ap.add_argument("--device", default="cpu", help="Where the sft judge trains: cpu, or cuda on a lent GPU.")
    ap.add_argument("--prm-width", type=int, default=active_prm.PRMSettings.width)
    ap.add_argument("--prm-layers", type=int, default=active_prm.PRMSettings.layers)
    ap.add_argument("--prm-steps", type=int, default=active_prm.PRMSettings.steps, help="Training steps a round.")
    ap.add_argument("--prm-lr", type=float, default=active_prm.PRMSettings.lr)
    ap.add_argument("--prm-warm-start", action="store_true", help="Each round continues from the last round's PRM.")
    ap.add_argument(
        "--strategies",
        nargs="+",
        default=list(DEFAULT_ARMS),
        choices=sorted(ARMS),
        help="The arms (convincing-wrong-mirror: convincing-wrong with mirror=yes). Without random the "
        "run prints its curves only; merge it with a run that has random by --from-json for the headline.",
    )
    ap.add_argument("--plot", type=Path, default=None, help="Write the learning curves here (PNG).")
    ap.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        default=None,
        help="Summarise (and plot) runs' printed JSON instead of running (several: their seeds together).",
    )
    args = ap.parse_args()
    if args.from_json:
        curves = merged_curves(args.from_json)
        random_curves = curves["random"]
        args.seeds, args.rounds = sorted(random_curves), len(next(iter(random_curves.values())))
        report(curves, args)
        return
    if args.numbers is None:
        args.numbers = "small" if args.judge == "sft" else "default"
    drawn = policy(args.numbers)
    truth = SyntheticPolicy(drawn["error_rate"], drawn["recovery_rate"], tuple(drawn["op_error_rates"].items()))
    results: dict[str, dict[int, list[dict[str, Any]]]] = {s: {} for s in args.strategies}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            root = Path(tmp) / f"seed{seed}"
            root.mkdir()
            pool_db = Database(f"sqlite:///{root}/questions.db")
            upgrade(str(pool_db.engine.url))
            synth_set(pool_db, "pool", problems=args.pool, seed=seed, **drawn)
            with pool_db.session() as s:
                questions = frozenset(q for (q,) in s.execute(text("SELECT question FROM problems")))
            pool_db.engine.dispose()
            heldout = write_processbench(root / "heldout.json", args.heldout, seed, truth, questions, args.numbers)
            for strategy in args.strategies:
                results[strategy][seed] = run_arm(strategy, seed, root, heldout, args)
    report(results, args)
    print(f"{time.perf_counter() - started:.0f} s")
    summary = {m: headline(results, m) for m in ("step_auc", "processbench_f1")} if "random" in results else {}
    arms = {arm: "".join(ARMS[arm]) for arm in results}
    emit(
        {
            "bench": "active",
            "args": {k: str(v) for k, v in vars(args).items()},
            "arms": arms,
            "curves": results,
            **summary,
        }
    )


def merged_curves(paths: Sequence[Path]) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Every seed of the runs' printed JSON (their last lines); a seed in two runs is refused.
    A run saved before the arms were recorded names its arms by their meaning now."""
    curves: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for path in paths:
        saved = saved_result(path)
        for arm, by_seed in saved["curves"].items():
            strategy = MIRRORED_BEFORE if arm == "convincing-wrong" and "arms" not in saved else arm
            into = curves.setdefault(strategy, {})
            for seed, curve in by_seed.items():
                if int(seed) in into:
                    raise SystemExit(f"seed {seed} of {strategy} is in more than one of {', '.join(map(str, paths))}")
                into[int(seed)] = curve
    return {**{arm: curves[arm] for arm in ARMS if arm in curves}, **curves}  # ARMS' order, then any other


def report(results: dict[str, dict[int, list[dict[str, Any]]]], args: argparse.Namespace) -> None:
    show(results, args)
    show_times(results)
    show_picks(results)
    if "random" not in results:
        print("\nno random arm: merge with a run that has one (--from-json A.json B.json) for the headline")
        return
    for metric in ("step_auc", "processbench_f1"):
        h = headline(results, metric)
        targets = ", ".join(f"{t:.3f}" for t in h["targets"].values())
        print(f"\n{metric}: rollouts each strategy needs to reach what random reaches with the whole budget")
        print(f"  (per seed: {targets}), as a share of the budget:")
        for strategy in results:
            r = h[strategy]
            per = ", ".join("never" if v is None else f"{v:.0%}" for v in r["share_per_seed"].values())
            mean = r["mean_share_where_reached"]
            where = "-" if mean is None else f"{mean:.0%}"
            print(f"  {strategy:>23}: reached on {r['reached']} seeds, mean {where} (per seed: {per})")
    if args.plot:
        plot(results, args.plot)
        print(f"learning curves: {args.plot}")


def show_times(results: dict[str, dict[int, list[dict[str, Any]]]]) -> None:
    """Wall time per round (mean over seeds): annotating (with the scoring jobs that order it),
    teaching the round's judge, evaluating it; and training's share of the whole run (runs
    saved before the judge's times were recorded have none)."""
    if not all("eval_s" in p for by_seed in results.values() for c in by_seed.values() for p in c):
        return
    print("\nwall time per round (mean over seeds): annotate (incl. scoring), train the judge, evaluate")
    total = {"annotate_s": 0.0, "train_s": 0.0, "eval_s": 0.0}
    for strategy, by_seed in results.items():
        for k in range(len(next(iter(by_seed.values())))):
            parts = {key: statistics.mean(c[k][key] for c in by_seed.values()) for key in total}
            print(
                f"  {strategy:>23} round {k + 1}: {parts['annotate_s']:>6.0f} s  {parts['train_s']:>6.0f} s  "
                f"{parts['eval_s']:>5.0f} s"
            )
            for key in total:
                total[key] += sum(c[k][key] for c in by_seed.values())
    whole = sum(total.values())
    print(
        f"  all rounds of every seed: {whole:.0f} s, of which annotating {total['annotate_s'] / whole:.0%}, "
        f"training {total['train_s'] / whole:.0%}, evaluating {total['eval_s'] / whole:.0%}"
    )


def show_picks(results: dict[str, dict[int, list[dict[str, Any]]]]) -> None:
    """What each strategy labelled, round by round (mean over seeds; runs saved before the
    picks were recorded have none)."""
    columns = (
        "trajectories", "wrong_answer_share", "with_error_share", "mean_first_error_step", "dead_prefix_share",
        "label_noise",
    )  # fmt: skip
    if not any("picked" in p for by_seed in results.values() for c in by_seed.values() for p in c):
        return
    print("\nwhat each round labelled (mean over seeds): trajectories, wrong answers, with a wrong step,")
    print("first wrong step, dead prefixes among its labelled chunks, label noise against the truth")
    for strategy, by_seed in results.items():
        for k in range(len(next(iter(by_seed.values())))):
            picks = [c[k]["picked"] for c in by_seed.values() if "picked" in c[k]]
            means = []
            for col in columns:
                values = [p[col] for p in picks if p[col] is not None]
                means.append(statistics.mean(values) if values else float("nan"))
            n, wrong, err, first, dead, noise = means
            print(
                f"  {strategy:>23} round {k + 1}: {n:>6.0f}  {wrong:>5.1%}  {err:>5.1%}  {first:>4.2f}  "
                f"{dead:>5.1%}  {noise:>5.1%}"
            )


def show(results: dict[str, dict[int, list[dict[str, Any]]]], args: argparse.Namespace) -> None:
    print(f"\nmean over seeds {args.seeds} [95% interval] (an arm run on fewer seeds says which)")
    print(f"{'round':>5} {'strategy':>23} {'rollouts':>8} {'step AUC':>24} {'ProcessBench F1':>24}")
    for k in range(args.rounds):
        for strategy, by_seed in results.items():
            curves = list(by_seed.values())
            x = statistics.mean(c[k]["rollouts"] for c in curves)
            auc = mean_ci([c[k]["step_auc"] for c in curves])
            f1 = mean_ci([c[k]["processbench_f1"] for c in curves])
            fewer = "" if sorted(by_seed) == sorted(args.seeds) else f" (seeds {', '.join(map(str, sorted(by_seed)))})"
            print(
                f"{k + 1:>5} {strategy:>23} {x:>8.0f} {auc[0]:>8.3f} [{auc[1]:.3f}, {auc[2]:.3f}] "
                f"{f1[0]:>8.1f} [{f1[1]:.1f}, {f1[2]:.1f}]{fewer}"
            )


if __name__ == "__main__":
    main()
