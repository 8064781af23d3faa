"""The judge at work: chunk-reset and Best-of-N with a trained judge on the tiny neural policy.

On held-out problems (a seed tag no training set uses), the weak neural policy of
``bench_budget`` (a character-level GPT-2 pretrained on correct solutions, sampled at
temperature 1 through the hf backend) solves each problem:

- **chunk-reset** (``stepq eval chunk-reset``'s code): the policy writes one chunk at a time, the
  judge checks it, a rejected chunk is drawn again from the same prefix, up to ``--retries``
  times; against plain chunk-by-chunk sampling, and against the synthetic truth as the judge
  (the oracle: what a perfect step judge buys this policy).  Final-answer accuracy with 95%
  bootstrap intervals over problems, the paired difference with its interval, and the tokens
  the policy wrote (rejected chunks included) against plain sampling's;
- **Best-of-N** on N samples per problem: the judge's pick (each sample's steps scored by the
  judge's P(Positive), the minimum over steps; and by its verdicts, 1/0) against majority vote
  and random choice on the same samples, and the oracle's pick.

The judge is any judge directory ``stepq eval`` reads: a GRPO run's ``final`` (its settings
saved beside it) or a benchmark judge (``bench_judge_capacity --keep``: the benchmark's judge
prompt is written beside it when it has none).

    python -m bench.experiments.bench_judge_at_work --judge runs/seed0-spelled_first-dead_2_16000_8-label
    python -m bench.experiments.bench_judge_at_work --quick        # tiny policy and judge: checks the chain

Prints a table and one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import emit
from bench.experiments.judge_format import JUDGE_TEMPLATE
from bench.experiments.neural_policy import (
    MAX_TOKENS,
    PROMPT,
    STRENGTHS,
    add_policy_cache_option,
    policy_model,
)
from bench.experiments.stats import bootstrap

HELDOUT_TAG = "judge-at-work"


def held_out_problems(count: int, seed: int) -> list[tuple[str, str]]:
    """(question, answer) of fresh small-number problems, drawn under a tag of their own."""
    from stepq.workers.backends.synthetic_policy import make_problem
    from stepq.workers.data.synthetic_set import NUMBERS
    from stepq.workers.seeds import derive_seed

    out = []
    for i in range(count):
        problem = make_problem(derive_seed(HELDOUT_TAG, seed, i), 3, 8, NUMBERS["small"])
        out.append((problem.question, str(problem.answer)))
    return out


def load_judge(path: Path, max_tokens: int) -> Any:
    """The judge as ``stepq eval`` builds it; ``path`` a model folder or a folder
    ``bench_judge_capacity --keep`` kept (its taught model, with the settings its run saved).  A
    model without saved settings gets the benchmark's prompt (the one it was taught with)
    written beside it."""
    from bench.experiments.judge_capacity import kept_verdict
    from stepq.trainer.evaluation.judge_spec import JudgeSpec, build_judge
    from stepq.trainer.generative_judge.judge_prompting import FILE, JudgeSettings

    kept = kept_verdict(path)
    path = kept[0] if kept else path
    if not (path / FILE).exists():
        JudgeSettings(JUDGE_TEMPLATE, chat_template=False, max_tokens=max_tokens, source="benchmark").save(path)
    return build_judge(JudgeSpec(model=str(path)))


def accuracy_ci(outcomes: Sequence[bool], seed: int) -> dict[str, Any]:
    def share(v: Sequence[bool]) -> float:
        return 100.0 * sum(v) / max(1, len(v))

    return {"accuracy": share(outcomes), "ci": bootstrap(list(outcomes), share, seed)}


def paired_gain(a: Sequence[bool], b: Sequence[bool], seed: int) -> dict[str, Any]:
    """Points gained by ``b`` over ``a`` on the same problems, with a bootstrap interval."""
    pairs = list(zip(a, b, strict=True))

    def gain(p: Sequence[tuple[bool, bool]]) -> float:
        return 100.0 * sum(int(y) - int(x) for x, y in p) / max(1, len(p))

    return {"gain": gain(pairs), "ci": bootstrap(pairs, gain, seed)}


def run_chunk_reset(backend: Any, judges: dict[str, Any], problems: Sequence[tuple[str, str]], args: Any) -> dict:
    from stepq.trainer.evaluation.chunk_reset import PolicyProblem, chunk_reset
    from stepq.trainer.evaluation.judges import AcceptAll
    from stepq.workers.backends.base import SamplingParams
    from stepq.workers.grading.grader import Grader

    grader = Grader()
    policy = [PolicyProblem(PROMPT.format(question=q), q, a) for q, a in problems]
    params = SamplingParams(max_tokens=MAX_TOKENS)
    runs: dict[str, Any] = {}
    for name, judge in {"plain": AcceptAll(), **judges}.items():
        started = time.perf_counter()
        retries = 0 if name == "plain" else args.retries
        report = chunk_reset(backend, params, judge, policy, max_retries=retries, seed=args.seed, grader=grader)
        runs[name] = {**report.as_dict(), **accuracy_ci(report.outcomes, args.seed), "outcomes": report.outcomes}
        runs[name]["seconds"] = round(time.perf_counter() - started)
    for name in judges:
        runs[name]["gain_over_plain"] = paired_gain(runs["plain"]["outcomes"], runs[name]["outcomes"], args.seed)
        runs[name]["tokens_over_plain"] = runs[name]["tokens"] / max(1, runs["plain"]["tokens"])
    return runs


def sample_candidates(backend: Any, problems: Sequence[tuple[str, str]], n: int, seed: int) -> list[list[dict]]:
    """N solutions per problem, cut into steps as the judge's training chunks were."""
    from stepq.workers.backends.base import GenerationRequest, SamplingParams
    from stepq.workers.data.segmentation import SegmentationError, segment
    from stepq.workers.grading.grader import Grader, extract_boxed, normalize
    from stepq.workers.seeds import derive_seed

    grader = Grader()
    requests = [
        GenerationRequest(PROMPT.format(question=q), tuple(derive_seed(HELDOUT_TAG, seed, i, j) for j in range(n)))
        for i, (q, _) in enumerate(problems)
    ]
    out = []
    generated = backend.generate(requests, SamplingParams(max_tokens=MAX_TOKENS))
    for (_, answer), completions in zip(problems, generated, strict=True):
        samples = []
        for c in completions:
            try:
                steps = segment(c.text, "step-markers").chunks if c.text else ("",)
            except SegmentationError:
                steps = (c.text,)
            boxed = extract_boxed(c.text)
            samples.append(
                {
                    "steps": steps,
                    "answer": None if boxed is None else normalize(boxed),
                    "correct": grader.grade(c.text, answer).reward == 1.0,
                }
            )
        out.append(samples)
    return out


def best_of_n_rows(
    problems: Sequence[tuple[str, str]],
    candidates: Sequence[Sequence[dict]],
    scorers: dict[str, Callable[[list[Any]], list[float]]],
    ns: Sequence[int],
    seed: int,
) -> list[dict[str, Any]]:
    """Per N: each scorer's pick (min over steps), majority vote and random choice, per problem."""
    from stepq.trainer.evaluation.best_of_n import Candidate, majority, pick
    from stepq.trainer.evaluation.judges import StepItem

    items = [
        StepItem(q, tuple(s["steps"][:k]), s["steps"][k])
        for (q, _), samples in zip(problems, candidates, strict=True)
        for s in samples
        for k in range(len(s["steps"]))
    ]
    step_scores = {name: fn(items) for name, fn in scorers.items()}
    per_sample: dict[str, list[list[list[float]]]] = {}
    for name, flat in step_scores.items():
        it = iter(flat)
        per_sample[name] = [[[next(it) for _ in s["steps"]] for s in samples] for samples in candidates]
    rows = []
    rng = random.Random(seed)
    for n in ns:
        outcome: dict[str, list[bool]] = {name: [] for name in [*scorers, "majority", "random"]}
        for p, samples in enumerate(candidates):
            first = samples[:n]
            for name in scorers:
                outcome[name].append(first[pick(per_sample[name][p][:n], "min")]["correct"])
            outcome["majority"].append(
                majority([Candidate(tuple(s["steps"]), s["answer"], s["correct"]) for s in first])
            )
            outcome["random"].append(first[rng.randrange(n)]["correct"])
        rows.append({"n": n, **{k: accuracy_ci(v, seed) for k, v in outcome.items()}, "outcomes": outcome})
    return rows


def show(result: dict[str, Any]) -> None:
    def ci(m: dict[str, Any]) -> str:
        return f"{m['accuracy']:5.1f} [{m['ci'][0]:5.1f}, {m['ci'][1]:5.1f}]"

    cr = result["chunk_reset"]
    print(f"chunk-reset on {result['problems']} held-out problems, up to {result['retries']} retries a chunk:")
    print(
        f"  {'policy with':<10} {'accuracy':>22} {'gain over plain':>24} {'tokens':>8} {'x plain':>8} {'rejected':>9}"
    )
    for name, r in cr.items():
        gain = r.get("gain_over_plain")
        g = f"{gain['gain']:+5.1f} [{gain['ci'][0]:+5.1f}, {gain['ci'][1]:+5.1f}]" if gain else ""
        ratio = f"{r['tokens_over_plain']:.2f}" if "tokens_over_plain" in r else "1.00"
        print(f"  {name:<10} {ci(r):>22} {g:>24} {r['tokens']:>8} {ratio:>8} {r['rejected_chunks']:>9}")
    print("Best-of-N (accuracy %, min over the steps' scores):")
    names = [k for k in result["best_of_n"][0] if k not in ("n", "outcomes")]
    print("  " + f"{'N':>3} " + " ".join(f"{k:>22}" for k in names))
    for row in result["best_of_n"]:
        print("  " + f"{row['n']:>3} " + " ".join(f"{ci(row[k]):>22}" for k in names))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--judge", type=Path, help="The trained judge's directory.")
    ap.add_argument("--policy", choices=sorted(STRENGTHS), default="weak")
    add_policy_cache_option(ap)
    ap.add_argument("--problems", type=int, default=300, help="Held-out problems.")
    ap.add_argument("--retries", type=int, default=5, help="Regenerations of a rejected chunk (StepWiser: five).")
    ap.add_argument("--n", default="1,2,4,8", help="Best-of-N sizes.")
    ap.add_argument("--judge-tokens", type=int, default=64, help="The judge's answer room, when it has no settings.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="A tiny policy and judge: checks the chain, measures nothing.")
    args = ap.parse_args()
    ns = sorted({int(n) for n in args.n.split(",")})
    from stepq.trainer.evaluation.judges import GenerativeScorer, SyntheticOracle
    from stepq.workers.backends.hf import HFBackend

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        if args.quick:
            args.problems, ns = 6, [1, 2]
            args.judge = args.judge or tiny_judge(Path(scratch) / "judge")
        elif args.judge is None:
            ap.error("--judge DIR is needed (or --quick)")
        policy_dir = policy_model(args.policy, args.policy_cache, args.quick, Path(scratch) / "policy")
        assert policy_dir is not None  # --policy is a neural strength
        backend = HFBackend.from_config({"model": str(policy_dir), "batch_size": 64})
        built = load_judge(args.judge, args.judge_tokens)
        problems = held_out_problems(args.problems, args.seed)
        try:
            cr = run_chunk_reset(backend, {"judge": built.judge, "oracle": SyntheticOracle()}, problems, args)
            candidates = sample_candidates(backend, problems, max(ns), args.seed)
            scorer = GenerativeScorer(built.judge, "logprob")
            oracle = SyntheticOracle()
            scorers = {
                "judge P(Positive)": lambda items: [0.0 if s is None else float(s) for s in scorer.scores(items)],
                "judge verdicts": lambda items: [1.0 if v is True else 0.0 for v in built.judge.judge(items)],
                "oracle": lambda items: [1.0 if v else 0.0 for v in oracle.judge(items)],
            }
            bon = best_of_n_rows(problems, candidates, scorers, ns, args.seed)
        finally:
            backend.close()
            built.close()
    drawn = [s["correct"] for samples in candidates for s in samples]
    result = {
        "benchmark": "judge_at_work",
        "judge": str(args.judge),
        "policy": args.policy if not args.quick else "quick",
        "problems": args.problems,
        "retries": args.retries,
        "policy_sample_accuracy": 100.0 * sum(drawn) / max(1, len(drawn)),
        "chunk_reset": cr,
        "best_of_n": bon,
        "seconds": round(time.perf_counter() - started),
    }
    show(result)
    emit(result)


def tiny_judge(path: Path) -> Path:
    """A judge of random weights with the benchmark's tokenizer: only for --quick."""
    from stepq.trainer.tiny_model import build_tiny_llama

    return build_tiny_llama(path, seed=0, max_positions=1024, hidden_size=64, num_layers=1)


if __name__ == "__main__":
    main()
