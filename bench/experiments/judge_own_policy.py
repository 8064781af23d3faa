"""The judge at work on its own policy (StepWiser's setting): the policy whose Monte Carlo labels
taught the judge is the policy it then serves.

The policy is the synthetic one ``bench_judge_capacity`` annotates (small numbers, recovery,
steps of different difficulty); the judge is one that benchmark kept (``--keep``: the spelled
judge taught the labels by cross-entropy).  On a held-out set of that policy (a set seed no
training set uses, ``trajectories_per_problem`` = the largest N) this runs what ``stepq eval``
runs, through the same functions:

- ``stepq eval chunk-reset --set S``: plain chunk-by-chunk sampling, chunk-reset with the judge
  and with the synthetic truth as the judge (the oracle), final-answer accuracy with 95%
  intervals over problems, the paired gain over plain sampling, and the tokens each spent;
- ``stepq eval best-of-n --set S --score-by logprob``: the sample with the highest lowest step
  P(Positive), against majority vote, random choice and the oracle's pick; from the same
  scores, why the pick is wrong where it is and two other picks (``best_of_n_reading``).

    python -m bench.experiments.bench_judge_capacity --seeds 0 --cells spelled/first-dead/2/16000/8 \\
        --targets label --keep runs
    python -m bench.experiments.judge_own_policy --judge runs/seed0-spelled_first-dead_2_16000_8-label --seed 0
    python -m bench.experiments.judge_own_policy --quick          # a tiny judge: checks the chain, measures nothing

Prints a table and one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import emit, saved_result
from bench.experiments.bench_judge_at_work import accuracy_ci, load_judge, paired_gain, tiny_judge
from bench.experiments.best_of_n_reading import read_rows, save_scores
from bench.experiments.judge_capacity_data import OP_ERROR_RATES, OWN_POLICY_SEED
from bench.experiments.stats import bootstrap

SET = "own-policy"
ERROR_RATE = 0.15
"""``bench_judge_capacity``'s policy (with its ``OP_ERROR_RATES`` and ``--recovery-rate``)."""


def at_work(db: Any, judge_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Chunk-reset and Best-of-N on the set, through ``stepq eval``'s own functions."""
    from stepq.trainer.evaluation.best_of_n import best_of_n
    from stepq.trainer.evaluation.judges import GenerativeScorer, SyntheticOracle
    from stepq.trainer.evaluation.validation import set_chunk_reset, set_step_scores

    built = load_judge(judge_dir, args.judge_tokens)
    try:
        started = time.perf_counter()
        judged = set_chunk_reset(db, SET, built.judge, args.retries, args.seed)
        judged_s = time.perf_counter() - started
        oracle = set_chunk_reset(db, SET, SyntheticOracle(), args.retries, args.seed)
        runs = {"plain": judged["plain"], "judge": judged["chunk_reset"], "oracle": oracle["chunk_reset"]}
        assert runs["plain"] == oracle["plain"], "plain sampling draws the same on both calls"
        for name, run in runs.items():
            run.update(accuracy_ci(run["outcomes"], args.seed))
            if name != "plain":
                run["gain_over_plain"] = paired_gain(runs["plain"]["outcomes"], run["outcomes"], args.seed)
                run["tokens_over_plain"] = run["tokens"] / max(1, runs["plain"]["tokens"])
        runs["judge"]["seconds"] = round(judged_s)
        ns = sorted({int(n) for n in args.n.split(",")})
        # what `stepq eval best-of-n --score-by logprob` scores, scored once and read several ways
        candidates, scores = set_step_scores(db, SET, GenerativeScorer(built.judge, "logprob"))
        _, truth = set_step_scores(db, SET, SyntheticOracle())
        by_judge, by_oracle = best_of_n(candidates, scores, ns, "min"), best_of_n(candidates, truth, ns, "min")
        if args.save_scores:
            save_scores(args.save_scores, candidates, scores, truth)
        bon = []
        readings = read_rows(candidates, scores, truth, by_judge, args.seed)
        for row, oracle_row, reading in zip(by_judge, by_oracle, readings, strict=True):
            methods = {**row.per_problem, "oracle": oracle_row.per_problem["judge"]}
            entry: dict[str, Any] = {"n": row.n, "problems": row.problems}
            for name, values in methods.items():
                key = "judge P(Positive)" if name == "judge" else name
                entry[key] = {"accuracy": 100.0 * sum(values) / max(1, len(values)), "ci": _ci(values, args.seed)}
            entry["judge_over_majority"] = paired_gain(row.per_problem["majority"], row.per_problem["judge"], args.seed)
            entry["reading"] = reading
            bon.append(entry)
        return {"chunk_reset": runs, "best_of_n": bon, "judge_outputs": built.judge.stats.as_dict()}
    finally:
        built.close()


def _ci(values: list[float], seed: int) -> tuple[float, float]:
    return bootstrap(values, lambda v: 100.0 * sum(v) / max(1, len(v)), seed)


def show(result: dict[str, Any]) -> None:
    def ci(m: dict[str, Any]) -> str:
        return f"{m['accuracy']:5.1f} [{m['ci'][0]:5.1f}, {m['ci'][1]:5.1f}]"

    def gain(g: dict[str, Any]) -> str:
        return f"{g['gain']:+5.1f} [{g['ci'][0]:+5.1f}, {g['ci'][1]:+5.1f}]"

    print(f"chunk-reset on {result['problems']} held-out problems, up to {result['retries']} retries a chunk:")
    print(
        f"  {'policy with':<10} {'accuracy':>22} {'gain over plain':>24} {'tokens':>8} {'x plain':>8} {'rejected':>9}"
    )
    for name, r in result["chunk_reset"].items():
        g = gain(r["gain_over_plain"]) if "gain_over_plain" in r else ""
        ratio = f"{r.get('tokens_over_plain', 1.0):.2f}"
        print(f"  {name:<10} {ci(r):>22} {g:>24} {r['tokens']:>8} {ratio:>8} {r['rejected_chunks']:>9}")
    print("Best-of-N (accuracy %, the sample whose lowest step score is highest):")
    names = ["judge P(Positive)", "majority", "random", "oracle"]
    print("  " + f"{'N':>3} " + " ".join(f"{k:>22}" for k in names) + f" {'judge - majority':>24}")
    for row in result["best_of_n"]:
        cells = " ".join(f"{ci(row[k]):>22}" for k in names)
        print("  " + f"{row['n']:>3} " + cells + f" {gain(row['judge_over_majority']):>24}")
    for row in result["best_of_n"]:
        read = row.get("reading")
        if read is None:  # a log from before the reading
            continue
        others = ", ".join(
            f"{name} {gain(g)}" for name, g in read["over_majority"].items() if name != "lowest step P(Positive)"
        )
        why = ", ".join(f"{k} {v}" for k, v in read["wrong_picks"].items())
        print(f"  N={row['n']}: other picks - majority: {others}; wrong picks: {why}")
        print(
            f"        lowest step P(Positive) exactly 1.0: right samples {read['right_samples']['saturated']:.1f}%, "
            f"wrong {read['wrong_samples']['saturated']:.1f}%; accepted whole: right "
            f"{read['right_samples']['accepted']:.1f}%, wrong {read['wrong_samples']['accepted']:.1f}%; "
            f"its quartiles: right {read['right_samples']['lowest_quartiles']}, "
            f"wrong {read['wrong_samples']['lowest_quartiles']}"
        )


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Every seed's chunk-reset and Best-of-N side by side, the mean over seeds, and the goal:
    chunk-reset with the judge gains at least half the oracle's gain, its interval clear of
    zero, on every seed; Best-of-N above majority vote."""
    rows = []
    for r in sorted(results, key=lambda r: r["seed"]):
        cr = r["chunk_reset"]
        judge, oracle = cr["judge"]["gain_over_plain"], cr["oracle"]["gain_over_plain"]
        row = {
            "seed": r["seed"], "plain": cr["plain"]["accuracy"], "judge": cr["judge"]["accuracy"],
            "oracle": cr["oracle"]["accuracy"], "judge_gain": judge, "oracle_gain": oracle,
            "share_of_oracle": judge["gain"] / oracle["gain"] if oracle["gain"] else None,
            "tokens_over_plain": cr["judge"]["tokens_over_plain"],
            "goal": judge["ci"][0] > 0 and judge["gain"] >= oracle["gain"] / 2,
            "best_of_n": {b["n"]: b["judge_over_majority"] for b in r["best_of_n"]},
        }  # fmt: skip
        rows.append(row)

    def ci(g: dict[str, Any]) -> str:
        return f"{g['gain']:+.1f} [{g['ci'][0]:+.1f}, {g['ci'][1]:+.1f}]"

    for row in rows:
        bon = "  ".join(f"N={n}: {ci(g)}" for n, g in row["best_of_n"].items())
        print(
            f"seed {row['seed']}: plain {row['plain']:.1f}, judge {row['judge']:.1f} ({ci(row['judge_gain'])}), "
            f"oracle {row['oracle']:.1f} ({row['oracle_gain']['gain']:+.1f}); judge/oracle gain "
            f"{row['share_of_oracle']:.2f}, {row['tokens_over_plain']:.2f}x tokens; "
            f"goal {'met' if row['goal'] else 'not met'}; Best-of-N judge - majority {bon}"
        )
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in ("plain", "judge", "oracle")}
    said = ", ".join(f"{k} {v:.1f}" for k, v in mean.items())
    print(f"mean over {len(rows)} seeds: {said}")
    return {"seeds": rows, "mean": mean, "goal_every_seed": all(r["goal"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--from-json", nargs="+", type=Path, help="Runs' logs (their last lines) or saved JSON files: the summary only."
    )
    ap.add_argument("--judge", type=Path, help="A judge bench_judge_capacity kept (--keep).")
    ap.add_argument("--problems", type=int, default=200, help="Held-out problems.")
    ap.add_argument("--retries", type=int, default=5, help="Regenerations of a rejected chunk (StepWiser: five).")
    ap.add_argument("--n", default="4,16", help="Best-of-N sizes.")
    ap.add_argument("--recovery-rate", type=float, default=0.05, help="The policy's, as the judge's training set.")
    ap.add_argument("--judge-tokens", type=int, default=64, help="The judge's answer room, when it has no settings.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--save-scores", type=Path, help="Keep the Best-of-N samples' step scores here (best_of_n_reading --scores)."
    )
    ap.add_argument("--quick", action="store_true", help="A tiny judge and set: checks the chain, measures nothing.")
    args = ap.parse_args()
    if args.from_json:
        emit({"benchmark": "judge_own_policy", **summary([saved_result(p) for p in args.from_json])})
        return
    from stepq.migrations import upgrade
    from stepq.models import Database
    from stepq.workers.data.synthetic_set import synth_set

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        if args.quick:
            args.problems, args.n = 4, "1,2"
            args.judge = args.judge or tiny_judge(Path(scratch) / "judge")
        elif args.judge is None:
            ap.error("--judge DIR is needed (or --quick)")
        url = f"sqlite:///{Path(scratch) / 'stepq.db'}"
        upgrade(url)
        db = Database(url)
        synth_set(
            db, SET, problems=args.problems, seed=OWN_POLICY_SEED + args.seed, error_rate=ERROR_RATE,
            recovery_rate=args.recovery_rate, op_error_rates=OP_ERROR_RATES, numbers="small",
            trajectories_per_problem=max(int(n) for n in args.n.split(",")),
        )  # fmt: skip
        measured = at_work(db, args.judge, args)
        db.engine.dispose()
    result = {
        "benchmark": "judge_own_policy",
        "judge": str(args.judge),
        "policy": "synthetic, small numbers",
        "problems": args.problems,
        "retries": args.retries,
        "seed": args.seed,
        **measured,
        "seconds": round(time.perf_counter() - started),
    }
    show(result)
    emit(result)


if __name__ == "__main__":
    main()
