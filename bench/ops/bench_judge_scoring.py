"""A generative judge's scoring pass (``score=logprob``): chunks/s with its answers generated
one chunk a call against in batches, on the same chunks.

    OMP_NUM_THREADS=1 python -m bench.ops.bench_judge_scoring [--judge DIR] [--chunks 200]

A priority round scores every waiting trajectory this way (``stepq annotate --priority
...:score=logprob``), as does ``stepq eval processbench --score-by logprob``: the judge writes
its analysis greedily, then P(Positive) is read at its verdict.  Until 2026-12-02 the hf
backend generated every context near the model's window (prompt and ``max_tokens`` past it,
as a judge's long prompts are on a small model) in a call of its own: batch 1 here.  Both
passes must give the same scores (to 1e-4; the run fails otherwise).

``--judge`` takes a trained judge (a training run's ``final/``); without it, a random 2-layer
character-level Llama of width 64 (bench_active's round judge's size) writing answers of
``--answer-tokens`` (80: a round judge's answers ran about that long), since a random model
writes no end of its own.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import emit
from stepq.trainer.evaluation.judge_spec import JudgeSpec, build_judge
from stepq.trainer.evaluation.judges import StepItem
from stepq.workers.backends.synthetic_policy import SyntheticPolicy, make_problem
from stepq.workers.data.synthetic_set import NUMBERS


def chunks(n: int) -> list[StepItem]:
    """Every chunk of synthetic solutions on small numbers (the round judge's range), ``n`` of them."""
    policy, items, i = SyntheticPolicy(error_rate=0.2, recovery_rate=0.0), [], 0
    while len(items) < n:
        problem = make_problem(i, numbers=NUMBERS["small"])
        steps = [s.text for s in policy.solve(problem, i)]
        items += [StepItem(problem.question, tuple(steps[:k]), steps[k]) for k in range(len(steps))]
        i += 1
    return items[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--judge", type=Path, default=None, help="A trained judge's model folder.")
    ap.add_argument("--chunks", type=int, default=200)
    ap.add_argument("--answer-tokens", type=int, default=80, help="The random judge's answer length.")
    ap.add_argument("--batch", type=int, default=16, help="The hf backend's batch size.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.judge
        max_tokens = None
        if model is None:
            from stepq.trainer.tiny_model import build_tiny_llama

            model = build_tiny_llama(Path(tmp) / "judge", seed=0, max_positions=1024, hidden_size=64, num_layers=2)
            max_tokens = args.answer_tokens
        spec = JudgeSpec(
            kind="model", backend="hf", model=str(model), backend_config={"batch_size": args.batch}, votes=1,
            max_tokens=max_tokens, score_by="logprob",
        )  # fmt: skip
        scorer = build_judge(spec).judge
        items = chunks(args.chunks)
        passes: dict[str, tuple[float, list[float]]] = {}
        for name, size in (("one chunk a call", 1), (f"batches of {args.batch}", args.batch)):
            scorer.model.backend.batch_size = size
            started = time.perf_counter()
            scores = scorer.scores(items)
            passes[name] = (time.perf_counter() - started, scores)
    (one_s, one), (batched_s, batched) = passes.values()
    gap = max(abs(a - b) for a, b in zip(one, batched, strict=True))
    if gap > 1e-4:
        raise SystemExit(f"the batched pass's scores differ from one chunk a call by {gap:.2e}")
    rates = {name: len(items) / seconds for name, (seconds, _) in passes.items()}
    print(f"{len(items)} chunks scored by {args.judge or 'a random tiny Llama'}")
    for name, (seconds, _) in passes.items():
        print(f"  {name:>16}: {seconds:6.1f} s, {rates[name]:6.1f} chunks/s")
    print(f"  batched {one_s / batched_s:.2f}x as fast; largest difference between the scores {gap:.1e}")
    emit(
        {
            "bench": "judge_scoring",
            "chunks": len(items),
            "judge": str(args.judge) if args.judge else f"random tiny llama, {args.answer_tokens}-token answers",
            "seconds": {name: seconds for name, (seconds, _) in passes.items()},
            "chunks_per_s": rates,
            "speedup": one_s / batched_s,
            "largest_difference": gap,
        }
    )


if __name__ == "__main__":
    main()
