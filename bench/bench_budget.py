"""Exhaustive vs. adaptive budgets on the synthetic policy, where the true Q is known.

    python -m bench.bench_budget [--problems 500] [--rollouts 16]

For each label rule: rollouts per labelled chunk, label accuracy against the ground truth
(the rule applied to the exact Q-values of the synthetic policy), and agreement with the
exhaustive labels.  Everything runs through the real task code (embedded runner, SQLite);
the exhaustive labels for the relative rules are recomputed from the Abs-Q run's stored
rollouts (``stepq label``), not sampled again.  The policy's recovery rate is 0 here so
that a dead prefix has a true Q of exactly 0 and every rule's truth is well defined.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from bench.common import emit
from stepq.migrations import upgrade
from stepq.models import Database
from stepq.workers.annotate import WorkerOptions, WorkerRuntime
from stepq.workers.budget import Adaptive
from stepq.workers.in_process import run_in_process
from stepq.workers.labels import LabelRule, parse_rule
from stepq.workers.planning import configure_annotation
from stepq.workers.qvalues import relabel_set
from stepq.workers.synthetic_policy import SyntheticPolicy, exact_q
from stepq.workers.synthetic_set import synth_set

RULES = ["abs-q", "rel-ratio", "rel-effective"]
ERROR_RATE = 0.1


def annotate(db: Database, name: str, problems: int, m: int, rule: LabelRule, budget: str) -> float:
    synth_set(db, name, problems=problems, seed=42, error_rate=ERROR_RATE, recovery_rate=0.0)
    configure_annotation(db, name, m, rule=rule.key, budget=budget)
    start = time.perf_counter()
    run_in_process(db, WorkerRuntime(db, WorkerOptions(batch_rollouts=256, name="bench")))
    return time.perf_counter() - start


def labels(db: Database, name: str, rule: LabelRule) -> dict[tuple[str, int], bool]:
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT p.external_id, c.idx, l.positive FROM chunk_labels l JOIN chunks c ON c.id = l.chunk_id "
                "JOIN trajectories t ON t.id = c.trajectory_id JOIN problems p ON p.id = t.problem_id "
                "JOIN problem_sets s ON s.id = p.problem_set_id WHERE s.name = :n AND l.rule = :r"
            ),
            {"n": name, "r": rule.key},
        )
        return {(ext, idx): bool(pos) for ext, idx, pos in rows}


def truth(db: Database, name: str, rule: LabelRule) -> dict[tuple[str, int], bool]:
    """The rule on the exact Q-values: Q(k) from whether chunks 1..k are all correct."""
    policy = SyntheticPolicy(error_rate=ERROR_RATE, recovery_rate=0.0)
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT p.external_id, t.n_chunks, c.idx, c.ground_truth FROM chunks c "
                "JOIN trajectories t ON t.id = c.trajectory_id JOIN problems p ON p.id = t.problem_id "
                "JOIN problem_sets s ON s.id = p.problem_set_id WHERE s.name = :n ORDER BY p.external_id, c.idx"
            ),
            {"n": name},
        ).all()
    out = {}
    for ext, n, idx, right in rows:
        before_right = True if idx == 1 else out_right[(ext, idx - 1)]
        q_before = exact_q(policy, n - idx + 1, before_right)
        q_after = exact_q(policy, n - idx, bool(right))
        out[(ext, idx)] = rule(q_before, q_after)
        out_right[(ext, idx)] = bool(right)
    return out


out_right: dict[tuple[str, int], bool] = {}


def rollouts(db: Database, name: str) -> int:
    with db.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM rollouts r JOIN trajectories t ON t.id = r.trajectory_id "
                    "JOIN problems p ON p.id = t.problem_id JOIN problem_sets s ON s.id = p.problem_set_id "
                    "WHERE s.name = :n"
                ),
                {"n": name},
            ).scalar_one()
        )


def accuracy(got: dict[tuple[str, int], bool], want: dict[tuple[str, int], bool]) -> float:
    return sum(got.get(k) == v for k, v in want.items()) / len(want)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=500)
    ap.add_argument("--rollouts", type=int, default=16)
    ap.add_argument("--budget", default=Adaptive().spec, help="the adaptive budget spec to measure")
    args = ap.parse_args()
    result: dict[str, object] = {
        "trajectories": args.problems,
        "rollouts_per_prefix": args.rollouts,
        "adaptive_budget": args.budget,
        "error_rate": ERROR_RATE,
        "recovery_rate": 0.0,
    }
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade(url)
        db = Database(url)
        secs = annotate(db, "exhaustive", args.problems, args.rollouts, parse_rule("abs-q"), "exhaustive")
        ex_rollouts = rollouts(db, "exhaustive")
        result["exhaustive_seconds"] = round(secs, 1)
        for spec in RULES:
            rule = parse_rule(spec)
            if spec != "abs-q":
                relabel_set(db, "exhaustive", rule)
            name = f"adaptive-{spec}"
            secs = annotate(db, name, args.problems, args.rollouts, rule, args.budget)
            want = truth(db, "exhaustive", rule)
            ex, ad = labels(db, "exhaustive", rule), labels(db, name, rule)
            chunks = len(want)
            ad_rollouts = rollouts(db, name)
            figures = {
                "chunks": chunks,
                "exhaustive_rollouts_per_chunk": round(ex_rollouts / chunks, 3),
                "adaptive_rollouts_per_chunk": round(ad_rollouts / chunks, 3),
                "fewer_rollouts": round(ex_rollouts / max(ad_rollouts, 1), 2),
                "exhaustive_accuracy": round(accuracy(ex, want), 4),
                "adaptive_accuracy": round(accuracy(ad, want), 4),
                "accuracy_change_points": round(100 * (accuracy(ad, want) - accuracy(ex, want)), 2),
                "agreement_with_exhaustive": round(accuracy(ad, ex), 4),
                "adaptive_labelled": len(ad),
                "adaptive_seconds": round(secs, 1),
            }
            print(spec, figures, flush=True)
            result[spec] = figures
        db.dispose()
    result["targets"] = {
        "abs-q": "fewer_rollouts >= 4",
        "relative": "fewer_rollouts >= 2",
        "accuracy": "accuracy_change_points >= -1",
    }
    emit(result)


if __name__ == "__main__":
    main()
