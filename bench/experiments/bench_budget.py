"""Exhaustive vs. adaptive budgets on synthetic policies whose shortcuts can fail.

    python -m bench.experiments.bench_budget [--problems 500] [--rollouts 16] [--settings all|quick]

Each setting is a synthetic policy with steps of different difficulty (per-operation error
rates: multiplications hardest), a recovery rate (self-correction: Q can rise again after a
wrong step) and a strength (the error rates scaled so that ~70%, ~40% or ~15% of answers are
right).  For every label rule it reports rollouts per labelled chunk, accuracy against the
truth (the rule applied to the policy's exact Q-values, ``synthetic_policy.trajectory_q``),
for exhaustive M and for the adaptive budget, the adaptive budget's agreement with the
exhaustive labels, and the noise floor: how well two independent exhaustive runs (the same
trajectories, other rollout seeds) agree.  Everything runs through the real task code (embedded runner, SQLite); the
exhaustive labels for the relative rules are recomputed from the same stored rollouts.
Targets (issue #12): adaptive accuracy no more than 1 point below exhaustive, with >= 4x
fewer rollouts for Abs-Q and >= 2x for the relative rules, in every setting.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.common import emit
from bench.experiments.budget_measures import RULES, accuracy, count, labels
from bench.experiments.budget_replay import dead_stays_dead, load_pools
from stepq.assembly import worker_runtime
from stepq.migrations import upgrade
from stepq.models import Database
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.backends.synthetic_policy import SyntheticPolicy, parse_problem, trajectory_q
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.labelling.budget import Adaptive, parse_budget
from stepq.workers.labelling.labels import LabelRule, label_chunks, parse_rule
from stepq.workers.labelling.posterior import Prefix, p_positive

DIFFICULTY = {"Add": 0.5, "Subtract": 1.0, "Multiply by": 3.0}
"""Relative error rates per operation: a multiplication goes wrong 6x as often as an addition."""
STRENGTH = {"strong": 0.03, "medium": 0.1, "weak": 0.22, "weakest": 0.3}
"""Error rate of a subtraction at each strength (about 80%, 50%, 25% and 15% of answers right)."""
SETTINGS = {
    "quick": [("medium", 0.05)],
    "all": [(s, r) for r in (0.0, 0.05, 0.2) for s in ("medium",)] + [(s, 0.05) for s in ("strong", "weak", "weakest")],
}
NEURAL = ("weak", "medium")
"""Strengths of the neural policy (``--settings neural``; ``bench/experiments/neural_policy.py``)."""


def policy_config(strength: str, recovery: float) -> dict[str, Any]:
    base = STRENGTH[strength]
    return {
        "error_rate": base,
        "recovery_rate": recovery,
        "op_error_rates": {op: min(0.95, base * f) for op, f in DIFFICULTY.items()},
    }


def annotate(
    db: Database,
    name: str,
    config: dict[str, Any],
    n: int,
    m: int,
    rule: LabelRule,
    budget: str,
    rollout_seed: int | None = None,
) -> float:
    synth_set(db, name, problems=n, seed=42, **config)
    if rollout_seed is not None:
        # the same problems and trajectories (drawn from seed 42), rollouts drawn with other
        # seeds: the set's seed is only read for rollout seeds once its trajectories exist
        with db.engine.begin() as conn:
            conn.execute(text("UPDATE problem_sets SET seed = :s WHERE name = :n"), {"s": rollout_seed, "n": name})
    configure_annotation(db, name, m, rule=rule.key, budget=budget)
    start = time.perf_counter()
    run_in_process(db, worker_runtime(db, WorkerOptions(batch_rollouts=256, name="bench")))
    return time.perf_counter() - start


def truth(db: Database, name: str, policy: SyntheticPolicy, rule: LabelRule) -> dict[tuple[str, int], bool]:
    """The rule on the exact Q-values of each stored trajectory (re-drawn from its seed)."""
    import random

    out: dict[tuple[str, int], bool] = {}
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT p.external_id, t.prompt, t.seed FROM trajectories t JOIN problems p ON p.id = t.problem_id "
                "JOIN problem_sets s ON s.id = p.problem_set_id WHERE s.name = :n"
            ),
            {"n": name},
        ).all()
    for ext, prompt, seed in rows:
        problem = parse_problem(prompt)
        steps = policy.continue_steps(problem, 0, problem.start, random.Random(seed))
        for idx, label in enumerate(label_chunks(rule, trajectory_q(policy, problem, steps)), start=1):
            assert label is not None
            out[(ext, idx)] = label
    return out


def posterior_labels(db: Database, name: str, rule: LabelRule, budget: str, m: int) -> dict[tuple[str, int], bool]:
    """The adaptive budget's Bayes label (its prior and link, no stopping) on a set's complete
    rollouts: how much of the adaptive accuracy is the estimator rather than the sampling."""
    policy = parse_budget(budget)
    assert isinstance(policy, Adaptive)
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT p.external_id, t.n_chunks, t.outcome, r.prefix_len, count(*), sum(r.reward) "
                "FROM rollouts r JOIN trajectories t ON t.id = r.trajectory_id "
                "JOIN problems p ON p.id = t.problem_id JOIN problem_sets s ON s.id = p.problem_set_id "
                "WHERE s.name = :n GROUP BY p.external_id, t.n_chunks, t.outcome, r.prefix_len"
            ),
            {"n": name},
        ).all()
    prefixes: dict[str, dict[int, Prefix]] = {}
    shape: dict[str, tuple[int, bool]] = {}
    for ext, n_chunks, outcome, k, samples, successes in rows:
        # no success in all M samples: dead, as the adaptive budget reads it
        dead = int(successes) == 0 and int(samples) >= m
        prefixes.setdefault(ext, {})[k] = Prefix(known=0.0) if dead else Prefix(int(samples), int(successes))
        shape[ext] = (n_chunks, bool(outcome))
    out: dict[tuple[str, int], bool] = {}
    for ext, (n_chunks, outcome) in shape.items():
        known = {**prefixes[ext], n_chunks: Prefix(known=float(outcome))}
        for i in range(1, n_chunks + 1):
            p = p_positive(rule, known[i - 1], known[i], policy.prior, policy.link)
            out[(ext, i)] = p >= 0.5
    return out


def measure(tmp: Path, strength: str, recovery: float, n: int, m: int, budget: str) -> dict[str, Any]:
    config = policy_config(strength, recovery)
    from stepq.workers.backends.synthetic import SyntheticBackend

    policy = SyntheticBackend.from_config(config).policy
    url = f"sqlite:///{tmp / f'{strength}-{recovery}.db'}"
    upgrade(url)
    db = Database(url)
    annotate(db, "exhaustive", config, n, m, parse_rule("abs-q"), "exhaustive")
    ex_rollouts = count(db, "exhaustive", "count(r.id)")
    ex_tokens = count(db, "exhaustive", "coalesce(sum(r.tokens), 0)")
    ex_prompt = count(db, "exhaustive", "coalesce(sum(r.prompt_tokens), 0)")
    with db.engine.connect() as conn:
        right = conn.execute(text("SELECT avg(CASE WHEN outcome THEN 1.0 ELSE 0.0 END) FROM trajectories")).scalar()
    setting: dict[str, Any] = {
        "policy": config,
        "answers_right": round(float(right or 0), 3),
        "dead_stays_dead": dead_stays_dead(load_pools(db, "exhaustive"), m),
    }
    # the noise floor: a second exhaustive run with independent rollouts
    annotate(db, "exhaustive-2", config, n, m, parse_rule("abs-q"), "exhaustive", rollout_seed=4242)
    for spec in RULES:
        rule = parse_rule(spec)
        if spec != "abs-q":
            from stepq.workers.labelling.qvalues import relabel_set

            relabel_set(db, "exhaustive", rule)
            relabel_set(db, "exhaustive-2", rule)
        name = f"adaptive-{spec}"
        annotate(db, name, config, n, m, rule, budget)
        want = truth(db, "exhaustive", policy, rule)
        ex, ad = labels(db, "exhaustive", rule), labels(db, name, rule)
        ad_rollouts = count(db, name, "count(r.id)")
        ad_tokens = count(db, name, "coalesce(sum(r.tokens), 0)")
        ad_prompt = count(db, name, "coalesce(sum(r.prompt_tokens), 0)")
        setting[spec] = {
            "chunks": len(want),
            "adaptive_rollouts_per_chunk": round(ad_rollouts / len(want), 2),
            "adaptive_tokens_per_chunk": round(ad_tokens / len(want), 1),
            "adaptive_prompt_tokens_per_chunk": round(ad_prompt / len(want), 1),
            "fewer_rollouts": round(ex_rollouts / max(ad_rollouts, 1), 2),
            "fewer_tokens": round(ex_tokens / max(ad_tokens, 1), 2),
            "fewer_prompt_tokens": round(ex_prompt / max(ad_prompt, 1), 2),
            "exhaustive_accuracy": round(accuracy(ex, want), 4),
            "adaptive_accuracy": round(accuracy(ad, want), 4),
            "accuracy_change_points": round(100 * (accuracy(ad, want) - accuracy(ex, want)), 2),
            "agreement_with_exhaustive": round(accuracy(ad, ex), 4),
            "exhaustive_2_accuracy": round(accuracy(labels(db, "exhaustive-2", rule), want), 4),
            # Abs-Q reads only whether a prefix is alive: no estimator to compare
            "exhaustive_posterior_accuracy": None
            if spec == "abs-q"
            else round(accuracy(posterior_labels(db, "exhaustive", rule, budget, m), want), 4),
            "noise_floor_agreement": round(accuracy(labels(db, "exhaustive-2", rule), ex), 4),
        }
        print(strength, recovery, spec, setting[spec], flush=True)
    db.dispose()
    return setting


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=500)
    ap.add_argument("--rollouts", type=int, default=16)
    ap.add_argument("--budget", default=Adaptive().spec, help="the adaptive budget spec to measure")
    ap.add_argument("--settings", choices=[*sorted(SETTINGS), "neural"], default="all")
    ap.add_argument("--neural-problems", type=int, default=160, help="trajectories per neural setting")
    ap.add_argument(
        "--per-problem",
        type=int,
        default=1,
        help="neural settings: trajectories per problem (siblings); --neural-problems / this many problems",
    )
    ap.add_argument("--reference-rollouts", type=int, default=64, help="M of the neural settings' reference")
    ap.add_argument("--policy-cache", type=Path, default=None, help="where the neural policies are kept")
    ap.add_argument(
        "--replay-budget",
        action="append",
        default=[],
        help="neural settings: also replay this budget spec on the exhaustive run's draws (repeat)",
    )
    ap.add_argument("--neural-strengths", default=",".join(NEURAL), help="which neural policies, comma-separated")
    args = ap.parse_args()
    if args.settings == "neural":
        from bench.experiments.budget_neural import measure_neural

        emit(measure_neural(args, tuple(args.neural_strengths.split(","))))
        return
    result: dict[str, Any] = {
        "trajectories": args.problems,
        "rollouts_per_prefix": args.rollouts,
        "budget": args.budget,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for strength, recovery in SETTINGS[args.settings]:
            key = f"{strength}/recovery={recovery}"
            result[key] = measure(Path(tmp), strength, recovery, args.problems, args.rollouts, args.budget)
    result["targets"] = {
        "abs-q": "fewer_rollouts >= 4",
        "relative": "fewer_rollouts >= 2 (and in tokens: fewer_tokens)",
        "accuracy": "accuracy_change_points >= -1",
    }
    emit(result)


if __name__ == "__main__":
    main()
