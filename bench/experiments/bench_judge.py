"""Judge-guided inference on the synthetic policy, where every step's truth is known.

- chunk-reset with the oracle judge vs plain chunk-by-chunk sampling on the same seeds: final
  accuracy and the extra tokens it costs; a judge that accepts everything changes nothing;
- Best-of-N with the oracle and min aggregation vs random choice and majority vote.

    python -m bench.experiments.bench_judge [--problems 500] [--error-rate 0.15] [--recovery-rate 0.05]

Prints a table, then one JSON object on its last line.
"""

from __future__ import annotations

import argparse

from bench.common import emit
from stepq.trainer.evaluation.best_of_n import best_of_n, synthetic_candidates
from stepq.trainer.evaluation.chunk_reset import PolicyProblem, chunk_reset
from stepq.trainer.evaluation.judges import AcceptAll, StepItem, SyntheticOracle
from stepq.workers.backends.base import SamplingParams
from stepq.workers.backends.synthetic import SyntheticBackend
from stepq.workers.backends.synthetic_policy import PROMPT_TEMPLATE, make_problem
from stepq.workers.seeds import derive_seed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=500)
    ap.add_argument("--error-rate", type=float, default=0.15)
    ap.add_argument("--recovery-rate", type=float, default=0.05)
    ap.add_argument("--retries", type=int, default=5, help="Regenerations of a rejected chunk (StepWiser: five)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    backend = SyntheticBackend(error_rate=args.error_rate, recovery_rate=args.recovery_rate)
    problems = []
    for i in range(args.problems):
        p = make_problem(derive_seed("bench-judge", args.seed, i))
        problems.append(PolicyProblem(PROMPT_TEMPLATE.format(question=p.question), p.question, str(p.answer)))
    params = SamplingParams()
    plain = chunk_reset(backend, params, AcceptAll(), problems, max_retries=0, seed=args.seed)
    accept_all = chunk_reset(backend, params, AcceptAll(), problems, max_retries=args.retries, seed=args.seed)
    oracle = chunk_reset(backend, params, SyntheticOracle(), problems, max_retries=args.retries, seed=args.seed)
    assert accept_all.solutions == plain.solutions, "an accept-all judge must change nothing"

    ns = [1, 2, 4, 8, 16]
    cands = synthetic_candidates(args.problems, max(ns), args.seed, args.error_rate, args.recovery_rate)
    judge = SyntheticOracle()
    scores = []
    for question, cs in cands:
        per = []
        for c in cs:
            items = [StepItem(question, c.steps[:i], c.steps[i]) for i in range(len(c.steps))]
            per.append([1.0 if v else 0.0 for v in judge.judge(items)])
        scores.append(per)
    rows = best_of_n([c for _, c in cands], scores, ns, "min")

    print(f"chunk-reset, {args.problems} problems, error rate {args.error_rate}, recovery {args.recovery_rate}")
    for name, r in (("plain", plain), ("accept-all", accept_all), ("oracle", oracle)):
        print(f"  {name:<11} accuracy {r.accuracy:6.2f}%  rejected chunks {r.rejected_chunks:5}  tokens {r.tokens}")
    print("best-of-N (oracle, min):   N   judge  random  majority")
    for r in rows:
        print(f"{'':>26}{r.n:>3} {r.judge:7.2f} {r.random:7.2f} {r.majority:8.2f}")
    emit(
        {
            "problems": args.problems,
            "error_rate": args.error_rate,
            "recovery_rate": args.recovery_rate,
            "chunk_reset": {
                "plain_accuracy": plain.accuracy,
                "oracle_accuracy": oracle.accuracy,
                "gain_points": oracle.accuracy - plain.accuracy,
                "accept_all_accuracy": accept_all.accuracy,
                "accept_all_identical": accept_all.solutions == plain.solutions,
                "plain_tokens": plain.tokens,
                "oracle_tokens": oracle.tokens,
                "extra_tokens_pct": 100.0 * (oracle.tokens - plain.tokens) / plain.tokens,
                "rejected_chunks": oracle.rejected_chunks,
                "forced_chunks": oracle.forced_chunks,
            },
            "best_of_n": [r.__dict__ for r in rows],
            "judge_beats_random_for_n_ge_2": all(r.judge > r.random for r in rows if r.n >= 2),
        }
    )


if __name__ == "__main__":
    main()
