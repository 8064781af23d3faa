"""What a cell's Monte Carlo labels teach about right steps: why a judge's P(Positive) on a
right sample sits near 0.5.

A judge taught by cross-entropy learns P(Positive | what it reads).  Its check (the spelled
analysis) redoes the judged step's arithmetic alone, so it tells a step that is locally right
from one that is not; it does not tell a right step on a right history from a right step that
follows an earlier error, and the labels tell those apart.  On a step whose check is clean its
verdict is at best the share of such steps its labels call Positive.  Abs-Q calls a step Negative
when none of its M rollouts ends right; a step after an earlier error ends right only where the
policy recovers, and a first-dead snapshot keeps such steps wherever the wrong step before them
was called Positive (a rollout recovered) or left out by the balancing.

This reads a prepared cell's training rows (``bench_judge_capacity --prepare-only``, synthetic
policy): the share labelled Positive among wrong steps, among locally right steps, and among
those on a right history and on a wrong one; among locally right steps by steps left and by
their true Q (the synthetic policy's exact chance of ending right from there, ``exact_q``, from
the state the step leaves); and the locally right share once the check rows a recipe teaches
beside the labels (``--check-rows N``: fresh steps, right on half, each verdict what the check
says) are counted in.

    python -m bench.experiments.label_reading --data runs/data --seeds 0 1 2 \\
        --cell spelled/first-dead/4/16000/8 --check-rows 2000

Pure counting; prints a line a seed and one JSON object on its last line.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.experiments.judge_format import row_local_truth

Q_BINS = (0.0, 0.25, 0.5, 0.75, 1.0001)
"""The true-Q buckets locally right steps are read in (the last one closed at 1)."""


def _share(positive: int, n: int) -> dict[str, Any]:
    return {"positive": _percent(positive, n), "n": n}


def _percent(hits: int, n: int) -> float | None:
    return round(100.0 * hits / n, 1) if n else None


def steps_left(row: Mapping[str, Any]) -> int:
    """How many steps the solution has still to write after the judged one."""
    from stepq.workers.backends.synthetic_policy import parse_problem

    return len(parse_problem(f"Problem: {row['problem']}").ops) - len(row["history"]) - 1


def true_q_after(
    row: Mapping[str, Any], error_rate: float, recovery_rate: float, op_rates: Mapping[str, float]
) -> float:
    """The synthetic policy's exact chance of ending right from the state the step leaves:
    its running value right where the row's ``truth`` says so (the step and every one before
    it right), else wrong (``exact_q``)."""
    from stepq.workers.backends.synthetic_policy import SyntheticPolicy, exact_q, parse_problem

    policy = SyntheticPolicy(error_rate=error_rate, recovery_rate=recovery_rate, op_error_rates=tuple(op_rates.items()))
    ops = [name for name, _ in parse_problem(f"Problem: {row['problem']}").ops]
    done = len(row["history"]) + 1
    if done == len(ops):
        return float(bool(row["truth"]))  # the final answer: right or not
    return exact_q(policy, len(ops) - done, bool(row["truth"]), ops[done:])


def label_reading(
    rows: Sequence[Mapping[str, Any]],
    q_after: Sequence[float],
    check: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The shares labelled Positive.  Each row carries ``truth`` (its step and every one before
    it right), its local truth (``row_local_truth``), ``problem_id``, ``chunk_index`` and
    ``q_before`` (the Monte Carlo Q of the prefix before it); ``q_after``: each row's true Q after
    its step; ``check``: rows whose verdict is the check's own (Positive exactly where the step
    is right), counted in the last figure only."""
    local = [(r, q) for r, q in zip(rows, q_after, strict=True) if row_local_truth(r)]
    wrong = [r for r in rows if not row_local_truth(r)]

    def positives(some: Sequence[Mapping[str, Any]]) -> int:
        return sum(r["label"] == "Positive" for r in some)

    def shares(groups: dict[Any, list[Mapping[str, Any]]]) -> dict[Any, dict[str, Any]]:
        return {k: _share(positives(v), len(v)) for k, v in sorted(groups.items())}

    by_left: dict[int, list[Mapping[str, Any]]] = {}
    by_q: dict[str, list[Mapping[str, Any]]] = {}
    for r, q in local:
        by_left.setdefault(steps_left(r), []).append(r)
        low = max(i for i, edge in enumerate(Q_BINS[:-1]) if q >= edge)
        by_q.setdefault(f"{Q_BINS[low]:.2f}-{min(1.0, Q_BINS[low + 1]):.2f}", []).append(r)
    right = [r for r, _ in local]
    check_right = sum(bool(c["local"]) for c in check)
    after_error = [(r, q) for r, q in local if not r["truth"]]
    wrong_at = {(r["problem_id"], r["chunk_index"]) for r in wrong}
    return {
        "rows": len(rows),
        "wrong_steps": _share(positives(wrong), len(wrong)),
        "right_steps": _share(positives(right), len(right)),
        "right_steps_right_history": _share(
            positives([r for r in right if r["truth"]]), sum(bool(r["truth"]) for r in right)
        ),
        "right_steps_wrong_history": _share(
            positives([r for r in right if not r["truth"]]), sum(not r["truth"] for r in right)
        ),
        "after_an_error": {  # why a first-dead snapshot holds them, and what they are worth
            "n": len(after_error),
            "true_q_below_0.25": _percent(sum(q < 0.25 for _, q in after_error), len(after_error)),
            "alive_before": _percent(sum(r["q_before"] > 0 for r, _ in after_error), len(after_error)),
            "earlier_wrong_step_in_rows": _percent(
                sum(any((r["problem_id"], i) in wrong_at for i in range(r["chunk_index"])) for r, _ in after_error),
                len(after_error),
            ),
        },
        "right_by_steps_left": shares(by_left),
        "right_by_true_q": shares(by_q),
        "right_with_check_rows": _share(positives(right) + check_right, len(right) + check_right),
        "check_rows": len(check),
    }


def main() -> None:
    from bench.common import emit
    from bench.experiments.bench_judge_capacity import Cell
    from bench.experiments.judge_capacity_data import ERROR_RATE, OP_ERROR_RATES, load_rows
    from bench.experiments.judge_check_rows import check_rows

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="bench_judge_capacity's --data folder.")
    ap.add_argument("--seeds", nargs="+", type=int, required=True)
    ap.add_argument("--cell", required=True, help="A synthetic policy's cell (its rows are read).")
    ap.add_argument("--check-rows", type=int, default=0, help="Check rows taught beside the labels (their count).")
    ap.add_argument("--recovery-rate", type=float, default=0.05, help="bench_judge_capacity's --recovery-rate.")
    args = ap.parse_args()
    cell = Cell.parse(args.cell)
    if cell.policy != "synthetic":
        ap.error("the true Q is the synthetic policy's: a neural policy's cell has none")
    out = []
    for seed in args.seeds:
        rows = load_rows(args.data / f"seed{seed}" / cell.data_key / "train.json.gz")
        q = [true_q_after(r, ERROR_RATE, args.recovery_rate, OP_ERROR_RATES) for r in rows]
        found = {"seed": seed, **label_reading(rows, q, check_rows(seed, args.check_rows) if args.check_rows else ())}
        after = found["after_an_error"]
        pct = {k: v["positive"] for k, v in found.items() if isinstance(v, dict) and "positive" in v}
        print(
            f"seed {seed}: {found['rows']} rows; labelled Positive: wrong steps {pct['wrong_steps']}%, right steps "
            f"{pct['right_steps']}% (on a right history {pct['right_steps_right_history']}% of "
            f"{found['right_steps_right_history']['n']}, after an earlier error {pct['right_steps_wrong_history']}% "
            f"of {found['right_steps_wrong_history']['n']}); with {found['check_rows']} check rows "
            f"{pct['right_with_check_rows']}%; after an error: true Q below 0.25 {after['true_q_below_0.25']}%, "
            f"alive before {after['alive_before']}%, the earlier wrong step in the rows "
            f"{after['earlier_wrong_step_in_rows']}%; "
            "right steps by true Q "
            + ", ".join(f"{k}: {v['positive']}% (n {v['n']})" for k, v in found["right_by_true_q"].items()),
            flush=True,
        )
        out.append(found)
    emit({"benchmark": "label_reading", "cell": cell.name, "seeds": out})


if __name__ == "__main__":
    main()
