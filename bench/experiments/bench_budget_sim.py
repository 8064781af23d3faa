"""Budget policies against the synthetic policy in pure Python: no database, no task code.

    python -m bench.experiments.bench_budget_sim [--budget adaptive --budget adaptive:link=0 ...]
                                     [--seed 42] [--settings all|quick] [--problems 500]

The same policies, rules and truth as ``bench_budget`` (it imports their definitions), with the
budget's ``decide`` driven directly and rollouts drawn straight from the synthetic policy, so a
setting takes seconds instead of minutes.  This is where the adaptive defaults were chosen:
candidates were compared on two seed sets (``--seed 42`` and ``--seed 7``; the trajectory and
rollout seeds differ from ``bench_budget``'s), and ``bench_budget`` then measured the chosen
defaults through the real task code.  It also times the budget's ``decide`` (the posterior
work a worker does between rounds).  Prints one line per setting and rule, then JSON.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from bench.common import emit
from bench.experiments.bench_budget import SETTINGS, policy_config
from bench.experiments.budget_measures import RULES
from stepq.workers.backends.synthetic_policy import SyntheticPolicy, make_problem, trajectory_q
from stepq.workers.labelling.budget import BudgetPolicy, Exhaustive, Observation, parse_budget
from stepq.workers.labelling.labels import LabelRule, label_chunks, parse_rule
from stepq.workers.seeds import derive_seed


def run(
    policy: SyntheticPolicy,
    budget: BudgetPolicy,
    rule: LabelRule,
    problems: int,
    m: int,
    seed: int,
    rollout_seed: int,
    per_problem: int = 1,
) -> tuple[int, int, float, float]:
    """Rollouts drawn, the tokens they generated (counted as the synthetic backend counts
    them: a rollout from an early prefix writes more), label accuracy against the exact-Q
    truth over ``problems`` × ``per_problem`` trajectories (each problem's other trajectories
    are its siblings), and the mean seconds one ``decide`` call took (the budget's own cost in
    a worker, paid once per round of a trajectory's rollouts)."""
    drawn = tokens = right = chunks = calls = 0
    deciding = 0.0
    for p in range(problems):
        problem = make_problem(derive_seed("problem", seed, p))
        drafts = [
            policy.solve(problem, derive_seed("trajectory", seed, p, *([j] if j else []))) for j in range(per_problem)
        ]
        texts = [[step.text for step in steps] for steps in drafts]
        outcomes = [steps[-1].value == problem.answer for steps in drafts]
        for j, steps in enumerate(drafts):
            values = [problem.start] + [s.value for s in steps]
            outcome = outcomes[j]
            sizes = tuple(len(step.text) for step in steps)
            siblings = tuple((_shared(texts[j], texts[i]), outcomes[i]) for i in range(per_problem) if i != j)
            truth = label_chunks(rule, trajectory_q(policy, problem, steps))
            rewards: dict[int, dict[int, int]] = {}
            while True:
                obs = Observation(
                    len(steps),
                    m,
                    outcome,
                    rewards,
                    budget.counts_trajectory(),
                    key=f"{seed}-{p}-{j}",
                    chunk_sizes=sizes,
                    siblings=siblings,
                )
                started = time.perf_counter()
                decision = budget.decide(obs, rule)
                deciding += time.perf_counter() - started
                calls += 1
                if decision.done:
                    break
                for k, indices in decision.requests.items():
                    for i in indices:
                        rng = random.Random(derive_seed("rollout", rollout_seed, seed, p, *([j] if j else []), k, i))
                        continuation = policy.continue_steps(problem, k, values[k], rng)
                        rewards.setdefault(k, {})[i] = int(continuation[-1].value == problem.answer)
                        tokens += len("".join(step.text for step in continuation).split())
                        drawn += 1
            right += sum(got == want for got, want in zip(decision.labels, truth, strict=True))
            chunks += len(steps)
    return drawn, tokens, right / chunks, deciding / calls


def _shared(mine: list[str], theirs: list[str]) -> int:
    """Leading chunks two trajectories of a problem have in common."""
    n = 0
    while n < min(len(mine), len(theirs)) and mine[n] == theirs[n]:
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", action="append", help="adaptive budget specs to compare (repeat)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--problems", type=int, default=500)
    ap.add_argument("--rollouts", type=int, default=16)
    ap.add_argument("--settings", choices=sorted(SETTINGS), default="all")
    ap.add_argument("--per-problem", type=int, default=1, help="trajectories per problem (siblings)")
    args = ap.parse_args()
    budgets = args.budget or ["adaptive"]
    result: dict[str, Any] = {
        "seed": args.seed,
        "problems": args.problems,
        "per_problem": args.per_problem,
        "budgets": budgets,
    }
    for strength, recovery in SETTINGS[args.settings]:
        from stepq.workers.backends.synthetic import SyntheticBackend

        policy = SyntheticBackend.from_config(policy_config(strength, recovery)).policy
        key = f"{strength}/recovery={recovery}"
        result[key] = {}
        for spec in RULES:
            rule = parse_rule(spec)
            common = (rule, args.problems, args.rollouts, args.seed)
            more = {"per_problem": args.per_problem}
            ex_drawn, ex_tokens, ex_acc, _ = run(policy, Exhaustive(), *common, rollout_seed=0, **more)
            _, _, floor_acc, _ = run(policy, Exhaustive(), *common, rollout_seed=1, **more)
            row: dict[str, Any] = {
                "exhaustive_accuracy": round(ex_acc, 4),
                "exhaustive_2_accuracy": round(floor_acc, 4),
            }
            line = f"{key} {spec}: exhaustive {100 * ex_acc:.1f} (second run {100 * floor_acc:.1f})"
            for budget in budgets:
                drawn, tokens, acc, per_call = run(policy, parse_budget(budget), *common, rollout_seed=0, **more)
                row[budget] = {
                    "fewer_rollouts": round(ex_drawn / max(drawn, 1), 2),
                    "fewer_tokens": round(ex_tokens / max(tokens, 1), 2),
                    "accuracy_change_points": round(100 * (acc - ex_acc), 2),
                    "decide_ms": round(1000 * per_call, 3),
                }
                line += (
                    f" | {budget}: {ex_drawn / max(drawn, 1):.2f}x rollouts, {ex_tokens / max(tokens, 1):.2f}x tokens,"
                    f" {100 * (acc - ex_acc):+.1f} pt,"
                    f" {1000 * per_call:.2f} ms/decision"
                )
            result[key][spec] = row
            print(line, flush=True)
    emit(result)


if __name__ == "__main__":
    main()
