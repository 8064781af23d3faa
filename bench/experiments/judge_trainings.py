"""Repeated trainings of one judge on the same data: each training's seed and kept folder, the
spread training alone causes, the one a user would keep without the truth, and the lines of runs
that taught different trainings joined into one.

``bench_judge_capacity --trainings K`` writes such trainings; ``kept_judge`` reads them back.
Pure functions of the runs' JSON (no model, no database), so that reading saved runs costs no
import of the training stack.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from bench.experiments.judge_capacity import TARGETS


def figure_spread(values: list[float]) -> dict[str, float]:
    """Mean, standard deviation, least and most of one figure over trainings (two or more)."""
    return {"mean": statistics.mean(values), "sd": statistics.stdev(values), "min": min(values), "max": max(values)}


def selected_training(trainings: list[dict[str, Any]]) -> int | None:
    """The training a user would keep without the truth: the highest balanced accuracy on the
    labels' own validation split (the snapshot's held-back problems, what `stepq eval snapshot`
    measures), the first on a tie; None when no training was measured there. The held-out
    files (the truth) and the judge at work play no part, so the choice can be tested on them."""
    measured = [
        (t["validation_balanced_accuracy"], -k) for k, t in enumerate(trainings) if "validation_balanced_accuracy" in t
    ]
    return -max(measured)[1] if measured else None


def judge_folder(
    seed: int,
    cell: str,
    target: str,
    k: int = 0,
    rows: int | None = None,
    backbone_seed: int | None = None,
    check_rows: int = 0,
    check_verdicts: str = "taught",
    check_slips: str = "1-9",
) -> str:
    """The folder ``--keep`` gives the k-th training of a cell's judge (``rows``: taught on that
    many rows by ``--equal-rows``; ``backbone_seed``: on the backbone of another seed than the
    rows', ``--backbone-seed``; ``check_rows``: with that many of ``judge_check_rows``' rows
    beside its own, ``--check-rows``, their verdicts ``untaught`` where ``--check-verdicts``
    says so, their claims moved as ``--check-slips`` says where not by 1-9); ``kept_judge`` finds
    the trainings' at-work logs by it."""
    sized = f"-rows{rows}" if rows is not None else ""
    crossed = f"-backbone{backbone_seed}" if backbone_seed is not None and backbone_seed != seed else ""
    checked = (
        f"-check{check_rows}"
        + ("" if check_verdicts == "taught" else f"-{check_verdicts}")
        + ("" if check_slips == "1-9" else f"-{check_slips}")
        if check_rows
        else ""
    )
    return f"seed{seed}-{cell.replace('/', '_')}{sized}{crossed}{checked}-{target}" + (f"-t{k}" if k else "")


def training_seed(seed: int, k: int) -> int:
    """The k-th training's seed on one seed's data and backbone: the seed itself first, so that
    a single training is the run the figures before ``--trainings`` came from."""
    return seed + 1000 * k


def joined_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines of runs that taught different trainings of one seed and cell (``--skip-trainings``)
    as one line each: the trainings in order of their seed, the spread and the kept training taken
    over all of them. Lines whose data or backbone differ (snapshot rows, rows taught, the
    backbone's hash, or its drills where a run has no hash) are not the same setup and are
    refused, as is a training taught in two runs (its figures would count twice). Lines that name
    different backbone seeds (``--backbone-seed``) or check rows (``--check-rows``,
    ``--check-verdicts``, ``--check-slips``) are different setups by design: kept apart, neither joined nor refused."""
    joined: dict[tuple[int, str, int | None, int, int, str, str], dict[str, Any]] = {}
    for run in runs:
        key = (
            run["seed"], run["cell"], run.get("train_rows"), run.get("backbone_seed", run["seed"]),
            run.get("check_rows", 0), run.get("check_verdicts", "taught"), run.get("check_slips", "1-9"),
        )  # fmt: skip
        if key not in joined:
            joined[key] = json.loads(json.dumps(run))  # a copy: the caller's lines stay as read
            continue
        into = joined[key]
        same = ["snapshot_rows", "backbone_drill_accuracy", "label_truth_agreement"]
        if "backbone_sha256" in into and "backbone_sha256" in run:  # runs before it was recorded: the drills
            same.append("backbone_sha256")
        for name in same:
            if into.get(name) != run.get(name):
                raise ValueError(
                    f"seed {key[0]} {key[1]}: {name} {into.get(name)} in one run, {run.get(name)} in another"
                )
        for target in (t for t in TARGETS if t in run):
            ours = into.get(f"{target}_trainings", [into[target]])
            theirs = run.get(f"{target}_trainings", [run[target]])
            taught = {t["training_seed"] for t in ours}
            twice = sorted(taught & {t["training_seed"] for t in theirs})
            if twice:
                raise ValueError(f"seed {key[0]} {key[1]} {target}: training seeds {twice} in two runs")
            into[f"{target}_trainings"] = sorted(ours + theirs, key=lambda t: t["training_seed"])
    for run in joined.values():
        for target in (t for t in TARGETS if f"{t}_trainings" in run):
            trainings = run[f"{target}_trainings"]
            run[target] = trainings[0]
            if len(trainings) > 1:
                run[f"{target}_spread"] = spread(trainings)
                run[f"{target}_selected"] = selected_training(trainings)
    return list(joined.values())


SPREAD_FIGURES = ("processbench_f1", "thresholded_f1", "step_accuracy")


def spread(trainings: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean, standard deviation, least and most of each headline figure over repeated trainings
    on the same data: what training alone moves, which the per-problem intervals leave out
    (``kinds_...``: on the held-out file of errors a step alone does not show)."""
    out = {}
    names = [(n, n, False) for n in SPREAD_FIGURES if all(n in t for t in trainings)]
    names += [(f"kinds_{n}", n, True) for n in SPREAD_FIGURES[:2] if all("kinds" in t for t in trainings)]
    for label, name, on_kinds in names:
        out[label] = figure_spread([(t["kinds"] if on_kinds else t)[name] for t in trainings])
    return out
