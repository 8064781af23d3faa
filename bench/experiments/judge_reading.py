"""What a spelled (or chain) judge reads: whether it writes the check right, and whether its verdict
follows the marks it wrote.

A ``spelled`` judge (``judge_format.py``) writes the judged step's arithmetic redone, the step's
claim beside it, the two numbers digit by digit with each pair marked ``=`` or ``#``, then its
verdict.  The analysis is a program's, taught by imitation; the verdict is what the labels teach.
So a judge that scores low on the held-out file can fail in two places, which ProcessBench's F1
does not tell apart:

- **the check**: its written analysis is not the program's (a wrong sum, a claim copied wrong);
- **the verdict**: the check is right, but the verdict does not follow its own marks (a ``#``
  and Positive, or no ``#`` and Negative).

A wrong sum is read once more: its sum on right and on wrong steps apart, and whether a wrong
sum is the step's own claim.  On a right step the claim is the right sum, so a judge can score
well on most steps by writing the claim back; a judge that does so gets its sum wrong exactly
on the steps whose arithmetic is wrong, and its marks never show a ``#`` there.

On the held-out file's steps (up to each solution's first wrong step, what ProcessBench scores,
where a step is right exactly when its own arithmetic is) this reads every step's answer greedily
and counts both; on the snapshot's validation rows (the policy's own steps, where a step can be
wrong with right arithmetic: an operand copied wrong) it also says how the verdict meets the
labels where the marks are clean and where they are not; on its own training rows, whether a
check it gets wrong on new steps was learnt at all (underfitting) or only not carried over.
Pure counting beside one greedy pass of the judge (``judge_capacity.LocalJudge``, as
``evaluate_capacity`` asks it).  Beside the judges it scores the program's own check followed
perfectly on each held-out file (``program_check_f1``): the ceiling a judge that imitates it can
reach, and below 100 where the check cannot see an error kind.  A chain judge's wrong chains
are read by where they first depart from the program's and by whether they computed the step's
own term instead of the problem's (what lets a copied operand pass).

    python -m bench.experiments.judge_reading --data runs/data --seed 2 \\
        --cell spelled/first-dead/2/2000/8/abs-q/medium \\
        --judges runs/seed2-spelled_first-dead_2_2000_8_abs-q_medium-label

Prints a line a judge and one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.experiments.judge_format import (
    APPLY,
    EQUATION,
    analysis_text,
    judge_prompt,
    row_local_truth,
    spelled_digits,
    step_truth,
)

if TYPE_CHECKING:
    from stepq.trainer.evaluation.judges import StepItem

READ = ("spelled", "chain")
"""The analyses whose last line is a digit line of marks a verdict can follow: ``spelled`` (the
step alone) and ``chain`` (the running value from the problem, every earlier step with it)."""

_MARKS = re.compile(r"^\S[=#]\S( \S[=#]\S)*$")


def written_check(answer: str) -> str | None:
    """The analysis a judge wrote (between ``Analysis:`` and its last box), None when the answer
    is not in that form."""
    head, box = answer.find("Analysis:\n"), answer.rfind("\n\\boxed{")
    if head < 0 or box < head:
        return None
    return answer[head + len("Analysis:\n") : box]


def marks_verdict(check: str | None) -> bool | None:
    """The verdict a check's own marks imply: Positive when its digit line has no ``#``; None
    when it has no digit line (its last line)."""
    if check is None:
        return None
    last = check.split("\n")[-1]
    return "#" not in last if _MARKS.match(last) else None


_CLAIM_LINE = re.compile(r"^(-?\d+)([+*-])(\d+)=(-?\d+) vs (-?\d+)$")
"""A check's line that computes the judged step and sets its claim beside it: the value it starts
from, the operation and operand, its result, the claim (a spelled check's first line, a chain's
last before the digit line)."""

CHECK_PARTS = ("operands", "sum", "claim", "marks")
"""Where a written check can go wrong: the step's operands copied, the judge's own sum of what
it copied, the step's claimed result copied, and the digit line spelled from the two numbers
it wrote."""


def check_parts(written: str | None, expected: str) -> dict[str, bool] | None:
    """Each part of a written check right or not, against the program's check of the same step;
    None when the written check is not in the check's form (two lines, the first an equation
    and a claim)."""
    lines = (written or "").split("\n")
    m, e = _first_lines(written, expected)
    if m is None or e is None or len(lines) != 2:
        return None
    a, op, b, result, claim = m.groups()
    return {
        "operands": (a, op, b) == e.groups()[:3],
        "sum": int(result) == APPLY[op](int(a), int(b)),
        "claim": claim == e.group(5),
        "marks": lines[1] == spelled_digits(result, claim),
    }


def sum_is_claim(written: str | None, expected: str) -> bool | None:
    """Whether the judge's own sum is the result the step claims (the program's claim, not the
    one the judge copied): the shortcut a check can take, since on most steps the claim is the
    right sum; None when the written check is not in the check's form."""
    m, e = _first_lines(written, expected)
    if m is None or e is None:
        return None
    return int(m.group(4)) == int(e.group(5))


def _first_lines(written: str | None, expected: str) -> tuple[re.Match[str] | None, re.Match[str] | None]:
    """The equation-and-claim lines of a written check and of the program's, each parsed."""
    return _CLAIM_LINE.match((written or "").split("\n")[0]), _CLAIM_LINE.match(expected.split("\n")[0])


DEPARTURES = ("no check", "an earlier step's line", "the judged step's line", "the digit line", "the length")
"""Where a written chain first departs from the program's: no analysis written, a line that
recomputes an earlier step, the judged step's own line (its value and the claim beside it), the
digit line, or every line right but too few or too many."""


def chain_departure(written: str | None, expected: str) -> str | None:
    """The first place a written chain differs from the program's (one of ``DEPARTURES``), None
    when it is the program's.  The program's chain is one line a step up to the judged one, then
    the digit line."""
    if written is None:
        return "no check"
    ours, theirs = written.split("\n"), expected.split("\n")
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return DEPARTURES[1 + (i >= len(theirs) - 2) + (i == len(theirs) - 1)]
    return None if len(ours) == len(theirs) else "the length"


def chain_ends_right(written: str | None, expected: str) -> bool:
    """Whether a written chain's last two lines (the judged step's value beside its claim, and
    the digit line) are the program's: its marks then say what the program's say, whatever it
    wrote before them."""
    return written is not None and written.split("\n")[-2:] == expected.split("\n")[-2:]


def _judged_lines(written: str | None, expected: str) -> tuple[re.Match[str] | None, re.Match[str] | None]:
    """The judged step's line (above the digit line) of a written chain and of the program's,
    each parsed; (None, None) where either has no such line."""
    lines, program = (written or "").split("\n"), expected.split("\n")
    if len(lines) < 2 or len(program) < 2:
        return None, None
    return _CLAIM_LINE.match(lines[-2]), _CLAIM_LINE.match(program[-2])


def copies_steps_term(written: str | None, expected: str, chunk: str) -> bool:
    """Whether a written chain's judged-step line takes the step's own operation and operand where
    the problem's differ, from the right running value (``65-4=61 vs 61`` where the program writes
    ``65-2=63 vs 61``): the check computes what the step wrote instead of what the problem asks,
    so a copied operand or a swapped operation leaves its marks clean."""
    ours, theirs = _judged_lines(written, expected)
    step = EQUATION.search(chunk)
    if not (step and ours and theirs):
        return False
    return ours.group(1) == theirs.group(1) and ours.group(2, 3) == step.group(2, 3) != theirs.group(2, 3)


def claims_its_own_value(written: str | None, expected: str) -> bool:
    """Whether a written chain's judged-step line puts its own value where the step's claim goes
    (``49-8=41 vs 41`` where the program writes ``49-8=41 vs 31``): the check misreads the claim,
    so a wrong result leaves its marks clean whatever the value it computed."""
    ours, theirs = _judged_lines(written, expected)
    return bool(ours and theirs) and ours.group(5) == ours.group(4) and ours.group(5) != theirs.group(5)


def _share(hits: int, n: int) -> dict[str, Any]:
    return {"n": n, "percent": 100.0 * hits / n if n else float("nan")}


def checked_truth(row: Mapping[str, Any], analysis: str) -> bool:
    """The truth a verdict after this check is scored by: the step alone, from the value written
    before it (``spelled``; what ProcessBench scores up to a solution's first wrong step), or the
    step and every one before it (``chain``: its running value is the problem's, not the steps')."""
    if analysis == "chain":
        return bool(row["truth"]) if "truth" in row else step_truth(row)
    return row_local_truth(row)


def reading(
    rows: Sequence[Mapping[str, Any]],
    answers: Sequence[str],
    verdicts: Sequence[bool | None],
    analysis: str = "spelled",
) -> dict:
    """Over the steps whose check the program can write (``analysis_text``): the check written
    right; the verdict following the judge's own marks (where it wrote marks and a verdict); the
    verdict against the truth it is scored by (``checked_truth``) where the check is right and
    where it is wrong; for a one-step check, its sum on right and on wrong steps, and how many
    wrong sums are the step's claim; for a chain, where a wrong one first departs from the
    program's (the verdict right there, by its truth), how often it still ends on the program's
    last two lines, how often it computed the step's own term (``copies_steps_term``) and how
    often it put its own value where the step's claim goes (``claims_its_own_value``); and,
    for rows with a Monte Carlo label, the verdict against the label by the judge's marks."""
    if analysis not in READ:
        raise ValueError(f"only a check with marks is read ({READ}), not {analysis!r}")
    right = follows = marked = 0
    truth_hits: dict[bool, list[int]] = {True: [0, 0], False: [0, 0]}
    label_hits: dict[str, list[int]] = {}
    checked = 0
    # by the step's own truth: [sums right, in form]; a wrong sum: [it is the step's claim, wrong sums]
    sum_by_truth: dict[bool, list[int]] = {True: [0, 0], False: [0, 0]}
    wrong_sum_claim = [0, 0]
    parts_right = dict.fromkeys(CHECK_PARTS, 0)
    parsed = 0
    # a wrong chain, by where it departs: [verdicts right, wrong chains]; of all wrong chains, how
    # many end on the program's last two lines and how many computed the step's own term
    departures: dict[str, list[int]] = {}
    wrong_chains = ends_right = steps_term = own_claim = 0
    for row, answer, verdict in zip(rows, answers, verdicts, strict=True):
        expected = analysis_text(row, analysis)
        if not expected:  # a step the checker cannot read (a model's malformed step)
            continue
        checked += 1
        local = checked_truth(row, analysis)
        written = written_check(answer)
        ok = written == expected
        right += ok
        parts = check_parts(written, expected) if analysis == "spelled" else None
        if parts is not None:
            parsed += 1
            for name, good in parts.items():
                parts_right[name] += good
            sum_by_truth[local][0] += parts["sum"]
            sum_by_truth[local][1] += 1
            if not parts["sum"]:
                wrong_sum_claim[0] += bool(sum_is_claim(written, expected))
                wrong_sum_claim[1] += 1
        if analysis == "chain" and not ok:
            departed = chain_departure(written, expected)
            assert departed is not None  # a chain that is not the program's departs somewhere
            where = departures.setdefault(departed, [0, 0])
            where[0] += verdict is local
            where[1] += 1
            wrong_chains += 1
            ends_right += chain_ends_right(written, expected)
            steps_term += copies_steps_term(written, expected, row["chunk"])
            own_claim += claims_its_own_value(written, expected)
        implied = marks_verdict(written)
        if implied is not None and verdict is not None:
            marked += 1
            follows += verdict is implied
        truth_hits[ok][0] += verdict is local
        truth_hits[ok][1] += 1
        if "label" in row and implied is not None:
            key = "clean marks" if implied else "a # mark"
            hit = label_hits.setdefault(key, [0, 0])
            hit[0] += verdict is (row["label"] == "Positive")
            hit[1] += 1
    return {
        "steps": checked,
        "check_right": _share(right, checked),
        "check_parts_right": {name: _share(hits, parsed) for name, hits in parts_right.items()},
        "sum_right_by_step": {"right steps": _share(*sum_by_truth[True]), "wrong steps": _share(*sum_by_truth[False])},
        "wrong_sum_is_claim": _share(*wrong_sum_claim),
        "verdict_follows_marks": _share(follows, marked),
        "verdict_right_where_check_right": _share(*truth_hits[True]),
        "verdict_right_where_check_wrong": _share(*truth_hits[False]),
        **({"verdict_agrees_with_label": {k: _share(*v) for k, v in label_hits.items()}} if label_hits else {}),
        **(
            {
                "wrong_chain_departs_at": {k: _share(*departures[k]) for k in DEPARTURES if k in departures},
                "wrong_chain_ends_right": _share(ends_right, wrong_chains),
                "wrong_chain_computes_steps_term": _share(steps_term, wrong_chains),
                "wrong_chain_claims_its_own_value": _share(own_claim, wrong_chains),
            }
            if analysis == "chain"
            else {}
        ),
    }


def heldout_steps(samples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A ProcessBench file's steps up to each solution's first wrong one (all of a right one)."""
    from bench.experiments.judge_capacity import processbench_steps

    first_wrong = {s["id"]: s["label"] for s in samples}
    return [
        it
        for it in processbench_steps(samples)
        if first_wrong[it["sample"]] == -1 or it["k"] <= first_wrong[it["sample"]]
    ]


def program_check_f1(samples: Sequence[Mapping[str, Any]], analysis: str) -> float:
    """ProcessBench F1 of the program's own check followed perfectly: each solution's first wrong
    step predicted at its first step whose program-written marks show a ``#`` (or a step the
    checker cannot read).  The ceiling a judge that imitates this check and follows its marks can
    reach on a file; below 100 where the check cannot see an error kind (a one-step check on a
    copied operand).  Predicted and scored as ``stepq eval processbench`` does a judge's verdicts."""
    from stepq.trainer.evaluation.processbench import predict, score

    predictions = predict(ProgramCheck(analysis), samples)
    return score("program", {s["id"]: s["label"] for s in samples}, predictions).f1


class ProgramCheck:
    """The program's own check as a step judge: the verdict its marks imply (no verdict where the
    checker cannot read the step)."""

    def __init__(self, analysis: str) -> None:
        self.analysis = analysis
        self.name = f"program-{analysis}"

    def judge(self, items: Sequence[StepItem]) -> list[bool | None]:
        rows = ({"problem": it.problem, "history": list(it.history), "chunk": it.chunk} for it in items)
        return [marks_verdict(analysis_text(row, self.analysis) or None) for row in rows]


def read_judge(
    judge: Path, rows: Sequence[Mapping[str, Any]], max_new: int, analysis: str = "spelled"
) -> dict[str, Any]:
    from bench.experiments.judge_capacity import LocalJudge, kept_verdict
    from stepq.trainer.generative_judge.prompt import parse_verdict

    kept = kept_verdict(judge)
    model = LocalJudge(kept[0] if kept else judge)
    answers = model.answers([judge_prompt(r["problem"], r["history"], r["chunk"]) for r in rows], max_new)
    return reading(rows, answers, [parse_verdict(a) for a in answers], analysis)


def show(name: str, where: str, r: Mapping[str, Any]) -> None:
    parts = r["check_parts_right"]
    in_form = parts["sum"]["n"]  # 0 for a chain's check: its parts are not read
    line = (
        f"{name} on {where}: {r['steps']} steps, check right {r['check_right']['percent']:.1f}%"
        + (
            " (" + ", ".join(f"{k} {v['percent']:.1f}%" for k, v in parts.items()) + f" of {in_form} in form)"
            if in_form
            else ""
        )
        + f", verdict follows its marks {r['verdict_follows_marks']['percent']:.1f}%, "
        f"verdict right where the check is right "
        f"{r['verdict_right_where_check_right']['percent']:.1f}% / wrong "
        f"{r['verdict_right_where_check_wrong']['percent']:.1f}% (n {r['verdict_right_where_check_wrong']['n']})"
    )
    by_step, copied = r["sum_right_by_step"], r["wrong_sum_is_claim"]
    if in_form:
        line += (
            f"; its sum right on right steps {by_step['right steps']['percent']:.1f}% "
            f"(n {by_step['right steps']['n']}), "
            f"on wrong ones {by_step['wrong steps']['percent']:.1f}% (n {by_step['wrong steps']['n']}); "
            f"a wrong sum is the step's claim {copied['percent']:.1f}% (n {copied['n']})"
        )
    if "wrong_chain_departs_at" in r:
        departs = r["wrong_chain_departs_at"].items()
        line += (
            "; a wrong chain departs at "
            + ", ".join(f"{k} {v['n']} (verdict right {v['percent']:.0f}%)" for k, v in departs)
            + f", ends right {r['wrong_chain_ends_right']['percent']:.1f}%, computes the step's own term "
            f"{r['wrong_chain_computes_steps_term']['percent']:.1f}%"
        )
        if "wrong_chain_claims_its_own_value" in r:  # read since 2026-12-07, evening
            line += f", claims its own value {r['wrong_chain_claims_its_own_value']['percent']:.1f}%"
    for key, v in r.get("verdict_agrees_with_label", {}).items():
        line += f"; agrees with the label where it wrote {key} {v['percent']:.1f}% (n {v['n']})"
    print(line, flush=True)


def main() -> None:
    from bench.common import emit
    from bench.experiments.bench_judge_capacity import Cell
    from bench.experiments.judge_capacity import answer_room
    from bench.experiments.judge_capacity_data import load_rows

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="bench_judge_capacity's --data folder.")
    ap.add_argument("--seed", type=int, required=True, help="Whose held-out file and validation rows.")
    ap.add_argument("--cell", required=True, help="The cell whose rows taught the judges (its answer room).")
    ap.add_argument("--judges", nargs="+", type=Path, required=True, help="Judge folders (--keep's).")
    ap.add_argument(
        "--rows", default="heldout,validation,train",
        help="Which rows to read, of heldout, heldout-kinds (the second held-out file: errors a step alone does not "
        "show), validation, train (the training rows take longest).",
    )  # fmt: skip
    args = ap.parse_args()
    cell = Cell.parse(args.cell)
    if unknown := set(args.rows.split(",")) - {"heldout", "heldout-kinds", "validation", "train"}:
        ap.error(f"--rows takes heldout, heldout-kinds, validation, train; not {', '.join(sorted(unknown))}")
    if cell.analysis not in READ:
        ap.error(f"only a judge whose check writes marks is read ({', '.join(READ)}), not {cell.analysis}")
    where = args.data / f"seed{args.seed}"
    train, val = (load_rows(where / cell.data_key / f"{n}.json.gz") for n in ("train", "validation"))
    files = {name: where / f"{name}.json" for name in ("heldout", "heldout-kinds")}  # the second: older runs lack it
    samples = {name: json.loads(path.read_text()) for name, path in files.items() if path.exists()}
    steps = {name: heldout_steps(found) for name, found in samples.items()}
    max_new = answer_room(train, cell.analysis)
    ceiling = {name: program_check_f1(found, cell.analysis) for name, found in samples.items()}
    print(
        "the program's own check followed perfectly: ProcessBench F1 "
        + ", ".join(f"{v:.1f} on {k}" for k, v in ceiling.items()),
        flush=True,
    )
    out = []
    for judge in args.judges:
        found = {"judge": str(judge)}
        for name, rows in (*steps.items(), ("validation", val), ("train", train)):
            if name not in args.rows.split(","):
                continue
            found[name] = read_judge(judge, rows, max_new, cell.analysis)
            show(judge.name, f"seed {args.seed}'s {name} rows", found[name])
        out.append(found)
    emit(
        {"benchmark": "judge_reading", "seed": args.seed, "cell": cell.name, "program_check_f1": ceiling, "judges": out}
    )


if __name__ == "__main__":
    main()
