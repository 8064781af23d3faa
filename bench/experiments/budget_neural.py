"""``bench_budget --settings neural``: the budgets on a tiny neural policy's trajectories.

For each strength of ``bench/experiments/neural_policy.py``: sample one trajectory per problem from the
model, or several (``--per-problem``: siblings, whose outcomes the adaptive budget counts as
samples of the prefixes they share), at temperature 1 through ``stepq generate``'s code and
the hf backend, then annotate
copies of that set through the real task code (embedded runner, SQLite, the hf backend):
exhaustive M (16), a reference of M = 64 with other rollout seeds, and the adaptive budget
under each label rule.  Labels are compared with the reference's (the target: the adaptive
budget agrees with it no more than 1 point less than exhaustive M does; exhaustive M's own
agreement is the noise floor) and with the synthetic checker's step truth (each chunk and
those before it compute the true running values).  Cost is counted in rollouts and in
generated tokens (characters: the policy's tokenizer reads one per token).

Two independent runs of 160 trajectories differ by a point or two of agreement by chance, so
each change is given with a 95% bootstrap interval over trajectories, and the budget (and
any ``--replay-budget``) is also replayed on exhaustive's own draws (``budget_replay``): the
same draws on both sides leave only what the budget's inference changes.  Each setting also
reports how often "dead stays dead" failed in the exhaustive run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.experiments.budget_measures import RULES, accuracy, count, labels
from bench.experiments.budget_replay import (
    by_evidence,
    change_interval,
    dead_stays_dead,
    load_pools,
    replay,
    trajectory_key,
)
from bench.experiments.neural_policy import (
    DEFAULT_CACHE,
    MAX_TOKENS,
    PROMPT,
    STRENGTHS,
    PolicyRefused,
    build_all,
    kept_build,
)
from stepq.assembly import worker_runtime
from stepq.migrations import upgrade
from stepq.models import Database
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.backends import SamplingParams
from stepq.workers.backends.synthetic_policy import step_is_right
from stepq.workers.data.policy_sampling import generate_trajectories
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.labelling.budget import parse_budget
from stepq.workers.labelling.labels import LabelRule, parse_rule
from stepq.workers.labelling.qvalues import relabel_set

SET = "neural"
SAMPLING = {"max_tokens": MAX_TOKENS}


def backend_config(model: Path) -> dict[str, Any]:
    return {"model": str(model), "batch_size": 64}


def sample_set(tmp: Path, strength: str, model: Path, problems: int, per_problem: int = 1) -> Path:
    """A SQLite file with the problems and ``per_problem`` trajectories of the policy on each."""
    path = tmp / f"{strength}-trajectories.db"
    upgrade(f"sqlite:///{path}")
    db = Database(f"sqlite:///{path}")
    sample_policy(db, SET, 42, problems, model, per_problem)
    db.dispose()
    return path


def sample_policy(
    db: Database, set_name: str, seed: int, problems: int, model: Path, per_problem: int = 1
) -> dict[str, Any]:
    """The set ``set_name`` of ``problems`` small-number problems with ``per_problem``
    trajectories each, sampled from the policy at temperature 1 as ``stepq generate`` samples;
    returns the annotation plan (``configure_annotation``'s options) that rolls out with the same
    policy."""
    from stepq.workers.backends.hf import HFBackend

    synth_set(db, set_name, problems=problems, seed=seed, trajectories_per_problem=0, numbers="small")
    policy = HFBackend.from_config(backend_config(model))
    try:
        params = SamplingParams.from_config(SAMPLING)
        generate_trajectories(db, set_name, policy, samples=per_problem, template=PROMPT, params=params)
    finally:
        policy.close()
    return {"backend": "hf", "backend_config": backend_config(model), "sampling": SAMPLING}


def sampled_share_right(model: Path, problems: int) -> float:
    """The share of the policy's temperature-1 samples (one a problem, ``stepq generate``'s code)
    whose final answer is right: its strength as the benchmarks sample it, where the greedy
    check is the build's."""
    with tempfile.TemporaryDirectory() as scratch:
        db = Database(f"sqlite:///{sample_set(Path(scratch), 'share', model, problems)}")
        try:
            with db.engine.connect() as conn:
                right = conn.execute(text("SELECT avg(CASE WHEN outcome THEN 1.0 ELSE 0.0 END) FROM trajectories"))
                return float(right.scalar() or 0.0)
        finally:
            db.dispose()


def annotate_copy(
    trajectories: Path, tag: str, model: Path, m: int, rule: LabelRule, budget: str, rollout_seed: int | None = None
) -> tuple[Database, float]:
    """A copy of the sampled set, annotated; returns it and the seconds the annotation took."""
    path = trajectories.with_name(f"{trajectories.stem}-{tag}.db")
    shutil.copyfile(trajectories, path)
    db = Database(f"sqlite:///{path}")
    if rollout_seed is not None:  # other rollout seeds; the trajectories are the same rows
        with db.engine.begin() as conn:
            conn.execute(text("UPDATE problem_sets SET seed = :s WHERE name = :n"), {"s": rollout_seed, "n": SET})
    configure_annotation(
        db, SET, m, rule=rule.key, budget=budget, backend="hf", backend_config=backend_config(model), sampling=SAMPLING
    )
    started = time.perf_counter()
    run_in_process(db, worker_runtime(db, WorkerOptions(batch_rollouts=256, name="bench")))
    return db, time.perf_counter() - started


def step_truth(db: Database) -> dict[tuple[str, int], bool]:
    """Whether each chunk and every one before it compute the true running values, by
    (``trajectory_key``, chunk index)."""
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT p.external_id, t.source_key, p.question, c.idx, c.text FROM chunks c "
                "JOIN trajectories t ON t.id = c.trajectory_id JOIN problems p ON p.id = t.problem_id "
                "ORDER BY t.id, c.idx"
            )
        ).all()
    out: dict[tuple[str, int], bool] = {}
    history: dict[str, list[str]] = {}
    for ext, source, question, idx, chunk in rows:
        key = trajectory_key(ext, source, per_trajectory=True)
        seen = history.setdefault(key, [])
        out[(key, idx)] = bool(step_is_right(question, seen, chunk))
        seen.append(chunk)
    return out


def measure_setting(tmp: Path, strength: str, model: Path, args: argparse.Namespace) -> dict[str, Any]:
    per_problem = args.per_problem
    trajectories = sample_set(tmp, strength, model, args.neural_problems // per_problem, per_problem)
    abs_q = parse_rule("abs-q")
    exhaustive, ex_s = annotate_copy(trajectories, "exhaustive", model, args.rollouts, abs_q, "exhaustive")
    reference, ref_s = annotate_copy(
        trajectories, "reference", model, args.reference_rollouts, abs_q, "exhaustive", rollout_seed=4242
    )
    with exhaustive.engine.connect() as conn:
        right, chunks_per = conn.execute(
            text("SELECT avg(CASE WHEN outcome THEN 1.0 ELSE 0.0 END), avg(n_chunks) FROM trajectories")
        ).one()
    ex_rollouts = count(exhaustive, SET, "count(r.id)")
    ex_tokens = count(exhaustive, SET, "coalesce(sum(r.tokens), 0)")
    ex_prompt = count(exhaustive, SET, "coalesce(sum(r.prompt_tokens), 0)")
    truth = step_truth(exhaustive)
    pools = load_pools(exhaustive, per_trajectory=True)
    setting: dict[str, Any] = {
        "policy": str(model),
        "answers_right": round(float(right or 0), 3),
        "chunks_per_trajectory": round(float(chunks_per or 0), 2),
        "steps_right": round(sum(truth.values()) / len(truth), 3),
        "dead_stays_dead": dead_stays_dead(pools, args.rollouts),
        # how much siblings share beyond the prompt: the evidence they give a prefix of its own
        "chunks_shared_with_a_sibling": round(
            sum(max((n for n, _ in p.siblings), default=0) for p in pools.values()) / len(pools), 2
        ),
        "exhaustive_seconds": round(ex_s, 1),
        "reference_seconds": round(ref_s, 1),
    }
    for spec in RULES:
        rule = parse_rule(spec)
        if spec != "abs-q":
            relabel_set(exhaustive, SET, rule)
            relabel_set(reference, SET, rule)
        adaptive, ad_s = annotate_copy(trajectories, f"adaptive-{spec}", model, args.rollouts, rule, args.budget)
        want, ex, ad = (labels(db, SET, rule, per_trajectory=True) for db in (reference, exhaustive, adaptive))
        ad_rollouts = count(adaptive, SET, "count(r.id)")
        ad_tokens = count(adaptive, SET, "coalesce(sum(r.tokens), 0)")
        ad_prompt = count(adaptive, SET, "coalesce(sum(r.prompt_tokens), 0)")
        setting[spec] = {
            "chunks": len(want),
            "exhaustive_tokens_per_chunk": round(ex_tokens / len(want), 1),
            "adaptive_rollouts_per_chunk": round(ad_rollouts / len(want), 2),
            "adaptive_tokens_per_chunk": round(ad_tokens / len(want), 1),
            "fewer_rollouts": round(ex_rollouts / max(ad_rollouts, 1), 2),
            "fewer_tokens": round(ex_tokens / max(ad_tokens, 1), 2),
            "exhaustive_prompt_tokens_per_chunk": round(ex_prompt / len(want), 1),
            "adaptive_prompt_tokens_per_chunk": round(ad_prompt / len(want), 1),
            "fewer_prompt_tokens": round(ex_prompt / max(ad_prompt, 1), 2),
            "exhaustive_agreement_with_reference": round(accuracy(ex, want), 4),
            "adaptive_agreement_with_reference": round(accuracy(ad, want), 4),
            "agreement_change_points": round(100 * (accuracy(ad, want) - accuracy(ex, want)), 2),
            "agreement_change_interval": change_interval(ad, ex, want),
            "reference_agreement_with_step_truth": round(accuracy(want, truth), 4),
            "exhaustive_agreement_with_step_truth": round(accuracy(ex, truth), 4),
            "adaptive_agreement_with_step_truth": round(accuracy(ad, truth), 4),
            "adaptive_seconds": round(ad_s, 1),
        }
        # the same budget (and any to compare) on exhaustive's own draws: inference alone
        for budget in dict.fromkeys([args.budget, *args.replay_budget]):
            again = replay(pools, parse_budget(budget), rule, args.rollouts)
            setting[spec].setdefault("replayed", {})[budget] = {
                "fewer_rollouts": round(ex_rollouts / max(again.rollouts, 1), 2),
                "fewer_tokens": round(ex_tokens / max(again.tokens, 1), 2),
                "agreement_change_points": round(100 * (accuracy(again.labels, want) - accuracy(ex, want)), 2),
                "agreement_change_interval": change_interval(again.labels, ex, want),
                "step_truth_change_points": round(100 * (accuracy(again.labels, truth) - accuracy(ex, truth)), 2),
                "by_evidence": by_evidence(again, ex, want),
            }
        adaptive.dispose()
        print(f"neural/{strength}", spec, setting[spec], flush=True)
    exhaustive.dispose()
    reference.dispose()
    return setting


def measure_neural(args: argparse.Namespace, strengths: tuple[str, ...]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "trajectories": args.neural_problems // args.per_problem * args.per_problem,
        "trajectories_per_problem": args.per_problem,
        "rollouts_per_prefix": args.rollouts,
        "reference_rollouts_per_prefix": args.reference_rollouts,
        "budget": args.budget,
    }
    models = build_all([STRENGTHS[s] for s in strengths], args.policy_cache or DEFAULT_CACHE)
    with tempfile.TemporaryDirectory() as tmp:
        for strength in strengths:
            model = models[STRENGTHS[strength]]
            result[f"neural/{strength}"] = measure_setting(Path(tmp), strength, model, args)
    result["targets"] = {
        "abs-q": "fewer_tokens >= 4",
        "relative": "fewer_tokens >= 2",
        "agreement": "agreement_change_points >= -1 (against the M = 64 reference)",
    }
    return result


def main() -> None:
    """``python -m bench.experiments.budget_neural``: each kept build's share of temperature-1
    samples right, as the benchmarks sample it (a build is compared by its greedy check)."""
    ap = argparse.ArgumentParser(description="The kept neural policies' temperature-1 samples: the share right.")
    ap.add_argument("--strengths", default="weak,medium")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="Looked in before the shipped builds.")
    ap.add_argument("--problems", type=int, default=200, help="Problems, one sample each.")
    args = ap.parse_args()
    for strength in args.strengths.split(","):
        try:
            kept = kept_build(STRENGTHS[strength], args.cache)
        except PolicyRefused as refused:
            raise SystemExit(f"neural policy: {refused}") from None
        share = sampled_share_right(kept, args.problems)
        print(json.dumps({"strength": strength, "path": str(kept), "problems": args.problems, "right": share}))


if __name__ == "__main__":
    main()
