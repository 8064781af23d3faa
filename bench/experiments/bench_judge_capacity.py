"""Capacity first: can a small judge learn to find the first wrong step, and from what?

The fast supervised check beside ``bench_judge_grpo``: the verdict (after its analysis, if
any) taught by cross-entropy, on the same synthetic sets, the same Monte Carlo labels (the
real annotation code), the same backbone recipe and the same kind of held-out ProcessBench
file.  Each cell of the sweep varies one thing that decides learnability:

- ``analysis``: ``none`` (verdict only), ``recompute`` (the judged step's arithmetic redone,
  then the verdict), ``resolve`` (the problem re-solved up to the step, then the verdict),
  ``compact`` (``recompute`` in a spelling the step never shows, ``45-7=38``, learnt by the
  backbone from arithmetic drills mixed into its pretraining), ``compare`` (``compact`` and the
  step's claimed result side by side, ``45-7=38 vs 37``), ``spelled`` (``compare``, then the two
  numbers digit by digit, each pair marked: ``3=3 8#7``), ``chain`` (the running value
  recomputed from the problem, its last line spelled so);
- ``form``: ``all`` labelled chunks (StepWiser's snapshot) or ``first-dead`` (each trajectory
  only up to its first dead prefix: ``stepq snapshot create --until-first-error``);
- ``layers``: the backbone's depth (head dimension 64 for vLLM's CPU kernels; width 64);
- ``problems``: the annotated set's size (one trajectory each);
- ``m``: rollouts per prefix;
- ``rule`` (optional sixth part, Abs-Q by default): the label rule of the snapshot.  The cells
  of one size and M share one annotated set, each further rule planned on it as ``stepq run
  --rule`` plans it, so rules are compared on the same rollouts; ``--equal-rows`` teaches each
  on as many rows as the smallest snapshot holds;
- ``policy`` (optional seventh part, ``synthetic`` by default): whose trajectories and rollouts
  are labelled: the synthetic policy, or a neural policy's strength (``weak``, ``medium``:
  ``bench/experiments/neural_policy.py``'s build, its own samples rolled out through the hf
  backend), the judge ``bench_judge_at_work --policy`` then puts to work on that policy.

Beside the labels (``--targets``), the same judge taught the synthetic truth on the same rows:
``truth`` (the step and every step before it right) or ``local`` (the step alone right, from
the value written before it; the same on every step ProcessBench scores): the ceiling, what the
backbone can learn at all.  Every figure comes with its run time.  A backbone is built once per
seed and depth (``judge_backbone.built_backbone``: fixed numerics, recorded, verified when kept).

    OMP_NUM_THREADS=2 python -m bench.experiments.bench_judge_capacity                     # the sweep, seed 0
    OMP_NUM_THREADS=2 python -m bench.experiments.bench_judge_capacity --seeds 0,1,2 \
        --cells spelled/first-dead/2/16000/8 --targets label,local                        # the check learnt
    OMP_NUM_THREADS=1 python -m bench.experiments.bench_judge_capacity --seeds 0 --targets label \
        --equal-rows --cells spelled/first-dead/2/16000/8,spelled/first-dead/2/16000/8/rel-ratio,\
spelled/first-dead/2/16000/8/rel-effective                                   # the rules at equal size
    python -m bench.experiments.bench_judge_capacity --seeds 0,1,2 --cells recompute/first-dead/2/600/8
    OMP_NUM_THREADS=1 python -m bench.experiments.bench_judge_capacity --seeds 0 --targets label \
        --cells spelled/first-dead/2/2000/8/abs-q/medium --keep runs             # the neural policy's labels
    OMP_NUM_THREADS=1 python -m bench.experiments.bench_judge_capacity --seeds 2 --targets label \
        --cells spelled/first-dead/2/2000/8/abs-q/medium --drill-floor 80 --keep runs   # a backbone to a skill
    OMP_NUM_THREADS=1 python -m bench.experiments.bench_judge_capacity --seeds 2 --targets label \
        --cells spelled/first-dead/2/2000/8/abs-q/medium --backbone-seed 0 --keep runs  # rows on another's backbone
    python -m bench.experiments.bench_judge_capacity --quick                               # a smoke run
    python -m bench.experiments.bench_judge_capacity --prepare-only --data DIR ...  # for judge_gpu.py

docs/experiments/judge_grpo.md ("Capacity") holds the figures.  Prints a table and one JSON
object on its last line.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.experiments.judge_backbone import BackboneRecipe, built_backbone
from bench.experiments.judge_capacity import (
    CPU,
    TARGETS,
    Device,
    answer_room,
    drill_accuracy,
    evaluate_capacity,
    kept_verdict,
    teach_verdict,
)
from bench.experiments.judge_capacity_data import (
    equal_rows,
    load_rows,
    prepare,
    take_rows,
    taught_elsewhere,
)
from bench.experiments.judge_check_rows import SLIPS, check_rows
from bench.experiments.judge_format import ANALYSES, DRILLED, row_local_truth
from bench.experiments.judge_trainings import judge_folder, selected_training, spread, training_seed
from bench.experiments.neural_policy import POLICIES, add_policy_cache_option, processor_name
from bench.experiments.stats import random_guess_f1
from stepq.workers.labelling.labels import RULES

FORMS = ("all", "first-dead")
DEFAULT_CELLS = (
    "none/all/2/600/8",
    "none/first-dead/2/600/8",
    "recompute/all/2/600/8",
    "recompute/first-dead/2/600/8",
    "resolve/first-dead/2/600/8",
    "none/first-dead/4/600/8",
    "none/first-dead/2/4000/8",
    "recompute/first-dead/2/4000/8",
    "recompute/first-dead/2/600/16",
    "recompute/first-dead/2/600/32",
)


@dataclass(frozen=True)
class Cell:
    analysis: str
    form: str
    layers: int
    problems: int
    m: int
    rule: str = "abs-q"
    policy: str = "synthetic"
    """Whose trajectories are annotated: the synthetic policy, or a neural policy's strength
    (``bench/experiments/neural_policy.py``) sampled and rolled out through the hf backend."""

    @classmethod
    def parse(cls, text: str) -> Cell:
        parts = text.strip().split("/")
        try:
            if len(parts) not in (5, 6, 7):
                raise ValueError
            analysis, form, layers, problems, m = parts[:5]
            cell = cls(analysis, form, int(layers), int(problems), int(m), *parts[5:])
        except ValueError:
            raise SystemExit(
                "a cell is analysis/form/layers/problems/m[/rule[/policy]], e.g. recompute/first-dead/2/600/8, "
                f"compare/first-dead/2/16000/8/rel-ratio or spelled/first-dead/2/4000/8/abs-q/medium; not {text!r}"
            ) from None
        known = (cell.analysis in ANALYSES, cell.form in FORMS, cell.rule in RULES, cell.policy in POLICIES)
        if not all(known):
            raise SystemExit(
                f"cell {text!r}: analysis one of {ANALYSES}, form one of {FORMS}, rule one of {tuple(RULES)}, "
                f"policy one of {POLICIES}"
            )
        return cell

    @property
    def name(self) -> str:
        tail = "" if self.rule == "abs-q" else f"/{self.rule}"
        tail = tail if self.policy == "synthetic" else f"/{self.rule}/{self.policy}"
        return f"{self.analysis}/{self.form}/{self.layers}/{self.problems}/{self.m}{tail}"

    @property
    def data_key(self) -> str:
        tail = "" if self.rule == "abs-q" else f"-{self.rule}"
        return f"{self.annotation_key}-{self.form}{tail}"

    @property
    def annotation_key(self) -> str:
        """The annotated set a cell's snapshot comes from: one set and one pool of rollouts for
        every rule and form at the same size and M, so that rules compare on the same draws."""
        return f"p{self.problems}-m{self.m}" + ("" if self.policy == "synthetic" else f"-{self.policy}")


def run_cell(
    data: Path,
    models: Path,
    seed: int,
    cell: Cell,
    args: argparse.Namespace,
    device: Device,
    train_rows: int | None = None,
) -> dict[str, Any]:
    where = data / f"seed{seed}"
    snapshot, val = (load_rows(where / cell.data_key / f"{n}.json.gz") for n in ("train", "validation"))
    train = take_rows(snapshot, train_rows, seed)
    heldout = json.loads((where / "heldout.json").read_text())
    tune = json.loads((where / "tune.json").read_text())
    kinds = [json.loads((where / f"{name}-kinds.json").read_text()) for name in ("heldout", "tune")]
    # as many drill documents as solutions, for the analyses in the drills' spelling
    drills = args.pretrain_problems if cell.analysis in DRILLED else 0
    backbone_seed = seed if args.backbone_seed is None else args.backbone_seed
    recipe = BackboneRecipe(
        backbone_seed, cell.layers, args.width, args.pretrain_problems, args.pretrain_steps, "small", batch=args.batch,
        drills=drills, drill_floor=args.drill_floor if drills else 0.0, threads=args.backbone_threads,
    )  # fmt: skip
    backbone = models / recipe.folder_name()
    fresh = not (backbone / "config.json").exists()
    started = time.perf_counter()
    record = built_backbone(backbone, recipe, device)  # built here, or verified against its record
    pretrain_s = time.perf_counter() - started if fresh else 0.0
    if fresh:
        print(f"  backbone seed {backbone_seed}, {cell.layers} layers: {record['steps']} steps, "
              f"loss {record['loss']:.3f}, {pretrain_s:.0f} s", flush=True)  # fmt: skip
    drilled = None
    if drills:  # a recorded build's last drills, under its numerics; a folder without a record is measured
        recorded = record["drills"]
        drilled = recorded[-1][1] if recorded else drill_accuracy(backbone, backbone_seed, device=device)
    check = (
        check_rows(seed, args.check_rows, taught_elsewhere(where, seed, snapshot + val, cell.policy), args.check_slips)
        if args.check_rows
        else []
    )
    max_new = answer_room([*train, *check], cell.analysis)
    result: dict[str, Any] = {
        "seed": seed, "cell": cell.name, **asdict(cell), "snapshot_rows": len(snapshot), "train_rows": len(train),
        "validation_rows": len(val),
        "positive_share": sum(r["label"] == "Positive" for r in train) / max(1, len(train)),
        "label_truth_agreement": sum((r["label"] == "Positive") == r["truth"] for r in train) / max(1, len(train)),
        "label_local_agreement": sum((r["label"] == "Positive") == row_local_truth(r) for r in train)
        / max(1, len(train)),
        "truth_local_agreement": sum(r["truth"] == row_local_truth(r) for r in train) / max(1, len(train)),
        "random_guess_f1": random_guess_f1(heldout, seed), "random_guess_f1_kinds": random_guess_f1(kinds[0], seed),
        "pretrain_s": round(pretrain_s), "teach_steps": args.steps, "check_rows": len(check),
        "check_verdicts": args.check_verdicts, "check_slips": args.check_slips,
        "backbone_drill_accuracy": drilled,
        "backbone_seed": backbone_seed, "backbone_steps": record["steps"], "backbone_drills": record["drills"],
        # the same command on another processor builds another backbone (the data stay the same)
        "backbone_sha256": record["weights_sha256"], "backbone_processor": record["processor"],
        "processor": processor_name(),
    }  # fmt: skip
    for target in args.targets.split(","):
        trainings = []
        for k in range(args.skip_trainings, args.trainings):
            started = time.perf_counter()
            rows = len(train) if train_rows is not None else None
            folder = models / judge_folder(
                seed, cell.name, target, k, rows, backbone_seed, len(check), args.check_verdicts, args.check_slips
            )  # fmt: skip
            kept = kept_verdict(folder) if args.rescore else None
            judge, loss = kept or teach_verdict(
                backbone, folder, train, target=target, analysis=cell.analysis, steps=args.steps,
                batch=args.batch, lr=args.lr, seed=training_seed(seed, k), device=device, check=check,
                check_untaught=args.check_verdicts == "untaught",
            )  # fmt: skip
            train_s = time.perf_counter() - started
            figures = evaluate_capacity(
                judge, val, heldout, tune, max_new=max_new, seed=seed, device=device, batch=args.eval_batch
            )
            figures["kinds"] = evaluate_capacity(
                judge, [], *kinds, max_new=max_new, seed=seed, device=device, batch=args.eval_batch
            )
            trainings.append(
                {
                    **figures,
                    "training": k,
                    "training_seed": training_seed(seed, k),
                    "loss": loss,
                    "train_s": round(train_s),
                    "eval_s": round(time.perf_counter() - started - train_s),
                }
            )
        result[target] = trainings[0]
        if args.trainings > 1:  # the list names every training by its seed, skipped ones absent
            result[f"{target}_trainings"] = trainings
        if len(trainings) > 1:
            result[f"{target}_spread"] = spread(trainings)
            result[f"{target}_selected"] = selected_training(trainings)
    return result


def show(r: dict[str, Any]) -> None:
    print(
        f"seed {r['seed']} {r['cell']}: {r['train_rows']} rows of {r.get('snapshot_rows', r['train_rows'])} "
        f"({100 * r['positive_share']:.0f}% Positive, "
        f"labels agree with the truth on {100 * r['label_truth_agreement']:.0f}%, with the local truth on "
        f"{100 * r.get('label_local_agreement', float('nan')):.0f}%; the truth with the local truth on "
        f"{100 * r.get('truth_local_agreement', float('nan')):.0f}%), "
        f"random-guess F1 {r['random_guess_f1']:.1f}"
        + (
            f", backbone computes {r['backbone_drill_accuracy']:.0f}% of drills"
            if r["backbone_drill_accuracy"] is not None
            else ""
        )
        + (f"; {r['check_rows']} check rows taught beside them" if r.get("check_rows") else "")
        + (" (their verdicts read, not taught)" if r.get("check_verdicts") == "untaught" else "")
        + (f" (claims moved: {r['check_slips']})" if r.get("check_rows") and r.get("check_slips") == "tens-too" else "")
    )
    for target in (t for t in TARGETS if t in r):
        several = f"{target}_trainings" in r
        for k, m in enumerate(r.get(f"{target}_trainings", [r[target]])):
            show_training(f"{target}#{m.get('training', k) + 1}" if several else target, m)
        if r.get(f"{target}_selected") is not None:  # a position in the list; a skipped run's starts later
            kept = r[f"{target}_selected"]
            number = r[f"{target}_trainings"][kept].get("training", kept) + 1
            print(f"  {target}: kept by the labels' validation split: #{number}", flush=True)
        if f"{target}_spread" in r:
            print(
                f"  {target} over {len(r[f'{target}_trainings'])} trainings: "
                + "; ".join(
                    f"{name} {v['mean']:.1f} (sd {v['sd']:.1f}, {v['min']:.1f}-{v['max']:.1f})"
                    for name, v in r[f"{target}_spread"].items()
                ),
                flush=True,
            )


def show_training(target: str, m: dict[str, Any]) -> None:
    def ci(v: float, lo_hi: Any) -> str:
        return f"{v:5.1f} [{lo_hi[0]:5.1f}, {lo_hi[1]:5.1f}]"

    print(
        f"  taught {target:<5}: F1 greedy {ci(m['processbench_f1'], m['processbench_f1_ci'])}, thresholded "
        f"{ci(m['thresholded_f1'], m['thresholded_f1_ci'])}; "
        f"step acc vs truth {ci(m['step_accuracy'], m['step_accuracy_ci'])}; "
        f"val bal acc {m.get('validation_balanced_accuracy', float('nan')):.1f}; no verdict {m['no_verdict']}; "
        f"{m['train_s']} s + {m['eval_s']} s",
        flush=True,
    )
    if "kinds" in m:
        k = m["kinds"]
        print(
            f"    on errors a step alone does not show: F1 greedy {ci(k['processbench_f1'], k['processbench_f1_ci'])}, "
            f"thresholded {ci(k['thresholded_f1'], k['thresholded_f1_ci'])}; "
            f"step acc vs truth {ci(k['step_accuracy'], k['step_accuracy_ci'])}",
            flush=True,
        )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0")
    ap.add_argument(
        "--targets",
        default="label,truth",
        help=f"What to teach, comma-separated, of {','.join(TARGETS)} (local: the step alone).",
    )
    ap.add_argument(
        "--cells", default=",".join(DEFAULT_CELLS), help="analysis/form/layers/problems/m[/rule], comma-separated."
    )
    ap.add_argument(
        "--heldout", type=int, default=300, help="Held-out ProcessBench samples (and half as many to tune on)."
    )
    ap.add_argument("--recovery-rate", type=float, default=0.05)
    add_policy_cache_option(ap)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--pretrain-problems", type=int, default=2000)
    ap.add_argument("--pretrain-steps", type=int, default=3000)
    ap.add_argument(
        "--drill-floor", type=float, default=0.0,
        help="Pretrain the backbone on (up to 3 rounds of 1,000 steps) until it computes this share (percent) of its "
        "drills; 0: the first 3,000-step build (analyses without drills ignore it). A deviation from the runs "
        "documented before 2026-12-03, named in the backbone's folder (-floorN) but not in its judges': give "
        "such a run its own --keep.",
    )  # fmt: skip
    ap.add_argument(
        "--backbone-seed", type=int, default=None,
        help="Teach every seed's rows on the backbone this seed builds instead of its own (a deviation that "
        "separates what the rows bring from what the backbone's pretraining seed brings); named in the judges' "
        "folders (-backboneN).",
    )  # fmt: skip
    ap.add_argument(
        "--backbone-threads", type=int, default=1,
        help="torch's CPU threads while a backbone is built, whatever OMP_NUM_THREADS (the weights depend on it).",
    )  # fmt: skip
    ap.add_argument(
        "--steps", type=int, default=3000,
        help="Cross-entropy steps teaching the verdict; recorded on every line but not named in the judges' "
        "folders: give another count its own --keep.",
    )  # fmt: skip
    ap.add_argument(
        "--check-rows", type=int, default=0,
        help="Teach this many of judge_check_rows' rows beside the labels' (fresh steps, the claim changed on half, "
        "their verdict the check's own): a deviation from the label-taught recipe, named in the judges' folders "
        "(-checkN).",
    )  # fmt: skip
    ap.add_argument(
        "--check-verdicts", choices=("taught", "untaught"), default="taught",
        help="untaught: the check rows' verdicts are read but kept out of the loss, so that every verdict taught "
        "is a label's (the rows teach the analysis alone; folders -checkN-untaught).",
    )  # fmt: skip
    ap.add_argument(
        "--check-slips", choices=SLIPS, default="1-9",
        help="tens-too: every other altered check row's claim moved by 10 instead of 1-9, so that it is wrong in "
        "the tens digit alone, as the neural policy's commonest slip is (a deviation; folders -checkN-...-tens-too).",
    )  # fmt: skip
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument(
        "--rescore",
        action="store_true",
        help="Score the judges --keep holds from an earlier run again instead of teaching them (new held-out "
        "files, a changed evaluation); a judge not there is taught.",
    )
    ap.add_argument(
        "--trainings",
        type=int,
        default=1,
        help="Judges taught a seed and target on the same data and backbone (training seeds seed, seed+1000, ...): "
        "their spread is what training alone moves a figure.",
    )
    ap.add_argument(
        "--skip-trainings",
        type=int,
        default=0,
        help="Teach only the trainings after the first N of --trainings (an earlier run holds those; "
        "kept_judge --collect joins the runs' lines).",
    )
    ap.add_argument(
        "--equal-rows",
        action="store_true",
        help="Teach every cell of a seed on as many rows as its smallest snapshot holds (drawn under the seed): "
        "rules compared at equal snapshot size.",
    )
    ap.add_argument("--eval-batch", type=int, default=128)
    ap.add_argument("--data", type=Path, default=None, help="Prepared data (kept, and reused if there).")
    ap.add_argument("--prepare-only", action="store_true", help="Write the data to --data and stop.")
    ap.add_argument(
        "--keep", type=Path, default=None, help="Keep the backbones and judges here (a backbone there is reused)."
    )
    ap.add_argument("--out", type=Path, default=None, help="Append each cell's figures here as a JSON line.")
    ap.add_argument("--quick", action="store_true", help="Tiny sizes: checks the chain runs, measures nothing.")
    return ap


def run(args: argparse.Namespace, device: Device = CPU, benchmark: str = "judge_capacity") -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if args.quick:
        args.heldout, args.pretrain_problems, args.pretrain_steps, args.steps = 20, 100, 30, 20
        if args.cells == ",".join(DEFAULT_CELLS):
            args.cells = "none/first-dead/1/40/4,recompute/all/1/40/4"
    seeds = [int(s) for s in args.seeds.split(",")]
    cells = [Cell.parse(c) for c in args.cells.split(",")]
    if not 0 <= args.skip_trainings < args.trainings:
        raise SystemExit(f"--skip-trainings {args.skip_trainings}: leaves none of --trainings {args.trainings}")
    unknown = set(args.targets.split(",")) - set(TARGETS)
    if unknown:
        raise SystemExit(f"--targets: {', '.join(sorted(unknown))} not one of {', '.join(TARGETS)}")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        data = args.data or Path(scratch) / "data"
        prepare(data, seeds, cells, args)  # what is there already is kept
        if args.prepare_only:
            return
        random.seed(0)
        for seed in seeds:
            rows = equal_rows(data, seed, cells) if args.equal_rows else None
            for cell in cells:
                print(f"== seed {seed}, cell {cell.name}" + (f", {rows} rows" if rows else ""), flush=True)
                started = time.perf_counter()
                r = run_cell(data, args.keep or Path(scratch) / "models", seed, cell, args, device, rows)
                r["cell_s"] = round(time.perf_counter() - started)
                show(r)
                results.append(r)
                if args.out:  # each cell as it ends: a run cut off keeps what it finished
                    with args.out.open("a") as f:
                        f.write(json.dumps(r, sort_keys=True) + "\n")
    # one JSON object on the last line, as bench.common.emit writes it (not imported: it needs a database driver)
    print(
        json.dumps(
            {
                "benchmark": benchmark,
                "device": device.name,
                "bf16": device.bf16,
                "args": {k: str(v) for k, v in vars(args).items()},
                "runs": results,
            },
            sort_keys=True,
        )
    )


def main() -> None:
    run(parser().parse_args())


if __name__ == "__main__":
    main()
