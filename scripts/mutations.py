"""Mutations of the methods' formulas and wiring that the one-minute tier must catch.

Each mutation is a one-line change a slip could make (an inequality loosened, chosen and
rejected swapped, a default dropped).  This script applies them one at a time to the working
tree, runs ``pytest -m unit`` and puts the line back, then says which survived: a survivor is a
method detail no fast test pins.  Run it before a release (about a minute a mutation):

    python scripts/mutations.py            # every mutation, the whole unit tier each
    python scripts/mutations.py --list     # the mutations and where they apply
    python scripts/mutations.py --only 3   # one of them

Exit status 1 when a mutation survives.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    what: str
    path: str
    before: str
    after: str


MUTATIONS = (
    Mutation(
        "the search's candidates cut at the first blank line, not by the set's segmentation",
        "workers/search/step_search.py",
        "cut = [next_chunk(c.text, spec.segmentation) for c in samples]",
        "cut = [next_chunk(c.text, None) for c in samples]",
    ),
    Mutation(
        "the set's sampling over the search's (T = 0.5, top_p = 0.95 lost)",
        "workers/search/step_search.py",
        "{**(set_sampling or {}), **(search_sampling or {})}",
        "{**(search_sampling or {}), **(set_sampling or {})}",
    ),
    Mutation(
        "a Q-pair's chosen and rejected texts swapped",
        "trainer/preferences/export.py",
        '"chosen": p.chosen,\n        "rejected": p.rejected,',
        '"chosen": p.rejected,\n        "rejected": p.chosen,',
    ),
    Mutation(
        "the pass rate without the trajectory's own outcome",
        "trainer/outcomes/export.py",
        "tally[0] += right + bool(outcome)",
        "tally[0] += right",
    ),
    Mutation(
        "the pass rate's bounds exclusive",
        "trainer/outcomes/export.py",
        "lo <= right / n <= hi",
        "lo < right / n < hi",
    ),
    Mutation(
        "the oracle threshold chosen but not used",
        "trainer/evaluation/processbench.py",
        "return chosen, predictions_at(step_scores, chosen)",
        "return chosen, predictions_at(step_scores, 0.5)",
    ),
    Mutation(
        "the oracle threshold from 2,000 candidates, not 10,000",
        "trainer/evaluation/processbench.py",
        "chosen = choose_threshold(step_scores, labels, ORACLE_CANDIDATES)",
        "chosen = choose_threshold(step_scores, labels)",
    ),
    Mutation(
        "step search's baseline sampled, not greedy",
        "trainer/evaluation/step_search_eval.py",
        "    baseline: str = GREEDY,\n) -> dict[str, object]:",
        "    baseline: str = SAMPLED,\n) -> dict[str, object]:",
    ),
    Mutation(
        "Rel-Effective's best-of-4 as best-of-2",
        "workers/labelling/labels.py",
        "return 1.0 - (1.0 - q) ** 4",
        "return 1.0 - (1.0 - q) ** 2",
    ),
    Mutation(
        "Rel-Ratio's comparison inclusive",
        "workers/labelling/labels.py",
        "return q_after / q_before > gamma",
        "return q_after / q_before >= gamma",
    ),
)


def survives(m: Mutation, pytest_args: list[str]) -> bool:
    path = ROOT / m.path
    original = path.read_text(encoding="utf-8")
    if original.count(m.before) != 1:
        raise SystemExit(f"{m.path}: the line to mutate is not there once ({m.before!r}): update this script")
    path.write_text(original.replace(m.before, m.after), encoding="utf-8")
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-m", "unit", "-x", "-q", "-p", "no:cacheprovider", *pytest_args],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    finally:
        path.write_text(original, encoding="utf-8")
    return run.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="print the mutations and stop")
    parser.add_argument("--only", type=int, action="append", help="run mutation N (1-based; repeatable)")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (e.g. a test file to run only it)")
    args = parser.parse_args()
    chosen = [(i, m) for i, m in enumerate(MUTATIONS, 1) if not args.only or i in args.only]
    if args.list:
        for i, m in chosen:
            print(f"{i:>2}. {m.what}  ({m.path})")
        return 0
    survivors = []
    for i, m in chosen:
        alive = survives(m, args.pytest_args)
        print(f"{i:>2}. {'SURVIVED' if alive else 'caught  '}  {m.what}", flush=True)
        survivors += [i] if alive else []
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} caught by pytest -m unit")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())
