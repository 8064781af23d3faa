"""Which of several trainings of a judge to keep, and what keeping it by the labels' own
validation split is worth on held-out data and at work.

Trainings of one recipe on the same labels and backbone land far apart (docs/experiments/
judge_at_work.md: 0.71 and 0.44 of the oracle's chunk-reset gain on one seed). A user has no
truth to choose by, only the snapshot's validation split (held-back problems, labelled like the
training rows: what ``stepq eval snapshot`` measures). This reads saved runs and prints, per
seed and cell, every training's validation balanced accuracy, its ProcessBench F1 on the held-out
file and, where it was put to work (``bench_judge_at_work``), its share of the oracle's
chunk-reset gain and Best-of-N over majority vote; the training ``selected_training`` keeps; and
over every group the kept trainings' figures beside the mean and the worst of all trainings.

    python -m bench.experiments.kept_judge docs/experiments/judge_trainings.json docs/experiments/judge_rules.json
    python -m bench.experiments.kept_judge docs/experiments/judge_at_work_kept.json
    # a run's files gathered into one: bench_judge_capacity --trainings K --out's lines and the
    # bench_judge_at_work logs of its trainings (matched by the judge's folder)
    python -m bench.experiments.kept_judge --collect OUT.json --judges seed0.jsonl --work work0*.log
    # a saved run's trainings and a later run's (--skip-trainings) joined, seed by seed and cell
    python -m bench.experiments.kept_judge --collect OUT.json --judges docs/experiments/judge_rules.json seed*-t3.jsonl

Prints a table and one JSON object (the summary) on its last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench.common import emit, saved_result
from bench.experiments.bench_judge_at_work import paired_gain
from bench.experiments.judge_trainings import figure_spread, joined_runs, judge_folder, selected_training, training_seed

TARGET = "label"


def run_folder(run: dict[str, Any], k: int) -> str:
    """The k-th training's folder, as ``bench_judge_capacity --keep`` named it (cells taught on
    every row of their snapshot; an ``--equal-rows`` run names the rows too and is not matched)."""
    return judge_folder(
        run["seed"], run["cell"], TARGET, k, backbone_seed=run.get("backbone_seed"),
        check_rows=run.get("check_rows", 0), check_verdicts=run.get("check_verdicts", "taught"),
        check_slips=run.get("check_slips", "1-9"),
    )  # fmt: skip


def at_work_figures(work: dict[str, Any]) -> dict[str, Any]:
    """The judge's chunk-reset gain as a share of the oracle's, and Best-of-N by its
    P(Positive) over majority vote per N (paired over the same problems; a ``judge_own_policy``
    log keeps the paired gain it measured, not the outcomes)."""
    cr = work["chunk_reset"]
    gain, oracle = cr["judge"]["gain_over_plain"], cr["oracle"]["gain_over_plain"]["gain"]
    bon = {
        str(row["n"]): paired_gain(row["outcomes"]["majority"], row["outcomes"]["judge P(Positive)"], 0)
        if "outcomes" in row
        else row["judge_over_majority"]
        for row in work["best_of_n"]
        if row["n"] > 1
    }
    return {
        "gain": gain["gain"],
        "gain_ci": gain["ci"],
        "oracle_gain": oracle,
        "share": gain["gain"] / oracle if oracle else float("nan"),
        "tokens_over_plain": cr["judge"]["tokens_over_plain"],
        "best_of_n_over_majority": bon,
    }


def groups(saved: dict[str, Any]) -> list[dict[str, Any]]:
    """One group per seed and cell with repeated trainings: each training's figures, the kept one."""
    out = []
    for entry in saved.get("seeds", [{"judge": r} for r in saved.get("runs", [])]):
        run = entry["judge"]
        trainings = run.get(f"{TARGET}_trainings")
        if not trainings:
            continue
        work = entry.get("at_work", {})
        rows = []
        for k, t in enumerate(trainings):
            row = {
                "training_seed": t.get("training_seed", training_seed(run["seed"], k)),
                "validation_balanced_accuracy": t.get("validation_balanced_accuracy"),
                "processbench_f1": t["processbench_f1"],
                "thresholded_f1": t["thresholded_f1"],
                "loss": t.get("loss"),  # the last logged training loss: how well the taught answers were learnt
            }
            if "kinds" in t:  # the held-out file of errors a step alone does not show
                row["kinds_processbench_f1"] = t["kinds"]["processbench_f1"]
            folder = run_folder(run, t.get("training", k))
            if folder in work:
                row["at_work"] = at_work_figures(work[folder])
            rows.append(row)
        out.append({"seed": run["seed"], "cell": run["cell"], "kept": selected_training(trainings), "trainings": rows})
    return out


FIGURES = {
    "processbench_f1": lambda r: r["processbench_f1"],
    "thresholded_f1": lambda r: r["thresholded_f1"],
    "share": lambda r: r["at_work"]["share"] if "at_work" in r else None,
}


def summary(found: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, over the groups: the kept trainings' mean and worst against a training drawn
    at random (the mean of each group's mean) and the worst of all (a group counts where it has
    more than one training and every training has the figure)."""
    out: dict[str, Any] = {"groups": len(found)}
    for name, get in FIGURES.items():
        usable = [
            g
            for g in found
            if len(g["trainings"]) > 1 and g["kept"] is not None and all(get(r) is not None for r in g["trainings"])
        ]  # a group of one training has nothing to choose
        if not usable:
            continue
        kept = [get(g["trainings"][g["kept"]]) for g in usable]
        drawn = [statistics.mean(get(r) for r in g["trainings"]) for g in usable]  # a training drawn at random
        out[name] = {
            "groups": len(usable),
            "kept_mean": statistics.mean(kept),
            "kept_min": min(kept),
            "all_mean": statistics.mean(drawn),
            "all_min": min(get(r) for g in usable for r in g["trainings"]),
            "kept_is_best": sum(get(g["trainings"][g["kept"]]) == max(get(r) for r in g["trainings"]) for g in usable),
        }
    return out


def by_cell(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per cell, every training of every seed pooled: the mean, the standard deviation between
    trainings, the least and the most of each held-out figure (what a recipe gives, seeds and
    trainings together; the per-problem intervals are in the runs)."""
    out: dict[str, dict[str, Any]] = {}
    for cell in dict.fromkeys(g["cell"] for g in found):
        rows = [r for g in found if g["cell"] == cell for r in g["trainings"]]
        figures: dict[str, Any] = {
            "trainings": len(rows),
            "seeds": sorted({g["seed"] for g in found if g["cell"] == cell}),
        }
        for name in ("processbench_f1", "thresholded_f1", "kinds_processbench_f1"):
            values = [r[name] for r in rows if name in r]
            if len(values) == len(rows) > 1:
                figures[name] = figure_spread(values)
        out[cell] = figures
    return out


def paired(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each cell against the first cell read, training by training on the same seed and training
    seed (the same backbone and held-out files): how many pairs it is above on, and the least and
    most difference. Pairs one cell lacks are left out, not guessed."""
    cells = list(dict.fromkeys(g["cell"] for g in found))
    by_key = {(g["cell"], g["seed"], r["training_seed"]): r for g in found for r in g["trainings"]}
    out: dict[str, dict[str, Any]] = {}
    for cell in cells[1:]:
        keys = [(s, t) for (c, s, t) in by_key if c == cell and (cells[0], s, t) in by_key]
        if not keys:
            continue
        figures: dict[str, Any] = {"against": cells[0], "pairs": len(keys)}
        for name in ("processbench_f1", "thresholded_f1"):
            diffs = [by_key[(cell, *k)][name] - by_key[(cells[0], *k)][name] for k in keys]
            figures[name] = {"above": sum(d > 0 for d in diffs), "min": min(diffs), "max": max(diffs)}
        out[cell] = figures
    return out


def each_figure(figures: dict[str, Any], shown: Any) -> str:
    """The named figures of a summary (its dict-valued entries), each as ``shown`` writes it."""
    return "; ".join(f"{name} {shown(v)}" for name, v in figures.items() if isinstance(v, dict))


def show(found: list[dict[str, Any]], totals: dict[str, Any]) -> None:
    for g in found:
        print(f"seed {g['seed']} {g['cell']}:")
        for k, r in enumerate(g["trainings"]):
            mark = "kept" if k == g["kept"] else ""
            val = r["validation_balanced_accuracy"]
            loss = r.get("loss")
            line = (
                f"  {mark:>4} #{k + 1} (training seed {r['training_seed']}): training loss "
                f"{float('nan') if loss is None else loss:.4f}, val bal acc "
                f"{float('nan') if val is None else val:5.1f}, F1 {r['processbench_f1']:5.1f} / "
                f"{r['thresholded_f1']:5.1f}"
            )
            if "at_work" in r:
                w = r["at_work"]
                bon = ", ".join(
                    f"N={n} {b['gain']:+.0f} [{b['ci'][0]:+.0f}, {b['ci'][1]:+.0f}]"
                    for n, b in w["best_of_n_over_majority"].items()
                )
                line += (
                    f"; chunk-reset {w['gain']:+.1f} [{w['gain_ci'][0]:+.1f}, {w['gain_ci'][1]:+.1f}] of the "
                    f"oracle's {w['oracle_gain']:+.1f} ({w['share']:.2f}), Best-of-N over majority {bon}"
                )
            print(line)
    for cell, figures in totals.get("by_cell", {}).items():
        seeds = ",".join(map(str, figures["seeds"]))
        each = each_figure(figures, lambda v: f"{v['mean']:.1f} (sd {v['sd']:.1f}, {v['min']:.1f}-{v['max']:.1f})")
        print(f"{cell} over {figures['trainings']} trainings (seeds {seeds}): {each}")
    for cell, p in totals.get("paired", {}).items():
        each = each_figure(p, lambda v: f"above on {v['above']} ({v['min']:+.1f} to {v['max']:+.1f})")
        print(f"{cell} against {p['against']}, paired over {p['pairs']} trainings: {each}")
    for name, s in totals.items():
        if isinstance(s, dict) and name in FIGURES:
            print(
                f"{name} over {s['groups']} groups: kept mean {s['kept_mean']:.2f} (worst {s['kept_min']:.2f}), "
                f"a training drawn at random {s['all_mean']:.2f} (worst of all {s['all_min']:.2f}); "
                f"the kept one is the group's best in {s['kept_is_best']}"
            )


def judge_lines(path: Path) -> list[dict[str, Any]]:
    """``bench_judge_capacity --out``'s lines, or the runs of a saved file (the docs' JSON)."""
    if path.suffix == ".json":
        return list(saved_result(path)["runs"])
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def collect(judges: list[Path], works: list[Path]) -> dict[str, Any]:
    """A run's judges and the at-work results of their trainings, as one saved file; the lines of
    runs that taught different trainings of one seed and cell joined (a saved file's runs too)."""
    runs = joined_runs([run for path in judges for run in judge_lines(path)])
    by_folder = {Path(w["judge"]).name: w for w in (saved_result(p) for p in works)}
    seeds = []
    for run in runs:
        trainings = run.get(f"{TARGET}_trainings", [run[TARGET]])
        folders = [run_folder(run, t.get("training", k)) for k, t in enumerate(trainings)]
        seeds.append({"judge": run, "at_work": {f: by_folder[f] for f in folders if f in by_folder}})
    return {"benchmark": "kept_judge", "seeds": seeds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("saved", nargs="*", type=Path, help="Saved runs: a benchmark's JSON with 'runs' or 'seeds'.")
    ap.add_argument("--collect", type=Path, help="Write the run given by --judges and --work here.")
    ap.add_argument("--judges", nargs="*", type=Path, default=[], help="bench_judge_capacity --out files.")
    ap.add_argument("--work", nargs="*", type=Path, default=[], help="bench_judge_at_work logs.")
    args = ap.parse_args()
    if args.collect:
        args.collect.write_text(json.dumps(collect(args.judges, args.work), indent=1, sort_keys=True) + "\n")
        args.saved = [*args.saved, args.collect]
    if not args.saved:
        ap.error("name saved runs, or --collect OUT with --judges and --work")
    found = [g for path in args.saved for g in groups(saved_result(path))]
    totals = {**summary(found), "by_cell": by_cell(found), "paired": paired(found)}
    show(found, totals)
    emit({"benchmark": "kept_judge", "summary": totals, "groups": found})


if __name__ == "__main__":
    main()
