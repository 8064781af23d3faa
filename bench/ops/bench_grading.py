"""Grading throughput: stepq's grader against plain math-verify on the same answers.

    python -m bench.ops.bench_grading [--rollouts 4000] [--math500 500]

Three answer sets, graded by both: synthetic-policy rollouts (integers, as in annotation),
the MATH-500 reference solutions against their answers (real LaTeX, all right), and each
MATH-500 solution against the next problem's answer (mostly wrong: the slow path).  Plain
math-verify parses the reference and the answer for every call; stepq's grader parses a
reference once, takes the exact/numeric fast paths, and falls back to math-verify in its
verify process (one process hop per slow-path answer: the price of a timeout that holds on
any thread).  The two must agree on every answer: the run fails otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

from bench.common import emit
from stepq.workers.backends.synthetic_policy import PROMPT_TEMPLATE, SyntheticPolicy, make_problem
from stepq.workers.grading.grader import Grader

# MATH-500 ships in data/ (data/README.md); STEPQ_DATA_DIR names another folder holding
# math500_test.jsonl.
SHIPPED = Path(__file__).resolve().parent.parent / "data" / "math500_test.jsonl"


def math500_file() -> Path:
    folder = os.environ.get("STEPQ_DATA_DIR")
    return Path(folder) / "math500_test.jsonl" if folder else SHIPPED


def synthetic_answers(n: int) -> list[tuple[str, str]]:
    policy = SyntheticPolicy()
    rng = random.Random(0)
    out = []
    problems = [make_problem(i) for i in range(200)]
    while len(out) < n:
        p = rng.choice(problems)
        prompt = PROMPT_TEMPLATE.format(question=p.question)
        out.append((policy.continue_text(prompt, "", rng.randrange(2**31)), str(p.answer)))
    return out


def math500_answers(n: int) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in math500_file().read_text().splitlines() if line.strip()]
    return [(r["solution"], r["answer"]) for r in rows[:n]]


def math500_shifted(n: int) -> list[tuple[str, str]]:
    """Each solution against the next problem's answer: mostly wrong, so no fast path."""
    pairs = math500_answers(n)
    return [(text, pairs[(i + 1) % len(pairs)][1]) for i, (text, _) in enumerate(pairs)]


def plain(answers: list[tuple[str, str]]) -> tuple[list[int], float]:
    from math_verify import parse, verify

    start = time.perf_counter()
    out = [int(verify(parse(f"${ref}$"), parse(text))) for text, ref in answers]
    return out, time.perf_counter() - start


def ours(answers: list[tuple[str, str]]) -> tuple[list[int], float]:
    """stepq's grader, its verify process already started (a worker starts it once)."""
    grader = Grader()
    grader.grade("\\boxed{x}", "1")  # start the verify process outside the timing
    start = time.perf_counter()
    out = [grader.grade(text, ref).reward for text, ref in answers]
    elapsed = time.perf_counter() - start
    grader.close()
    return out, elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=4000)
    ap.add_argument("--math500", type=int, default=500)
    args = ap.parse_args()
    result: dict[str, object] = {}
    failures: list[str] = []
    sets = (
        ("synthetic", synthetic_answers(args.rollouts)),
        ("math500", math500_answers(args.math500)),
        ("math500_shifted", math500_shifted(args.math500)),
    )
    for name, answers in sets:
        ref, ref_s = plain(answers)
        got, got_s = ours(answers)
        agree = sum(a == b for a, b in zip(ref, got, strict=True)) / len(answers)
        result[name] = {
            "answers": len(answers),
            "math_verify_per_s": round(len(answers) / ref_s, 1),
            "stepq_per_s": round(len(answers) / got_s, 1),
            "speedup": round(ref_s / got_s, 2),
            "agreement": round(agree, 4),
            "correct_share": round(sum(got) / len(got), 4),
        }
        print(name, result[name], flush=True)
        if agree < 1.0:
            bad = [a for a, x, y in zip(answers, ref, got, strict=True) if x != y][:5]
            failures.append(f"{name}: stepq disagrees with plain math-verify on {1 - agree:.2%}, e.g. {bad}")
    emit(result)
    if failures:  # the fast paths must never change a verdict
        raise SystemExit("\n".join(failures))


if __name__ == "__main__":
    main()
