"""Step labels or outcomes?  The discriminative PRM trained both ways on one annotation.

Per seed:
1. a synthetic set (small numbers, recovery, steps of different difficulty) annotated by
   stepq in process (Abs-Q, M rollouts a prefix: Monte Carlo labels, not the truth) and a
   snapshot of every labelled step, split by problem (``stepq snapshot create --unbalanced``:
   a step-label PRM trains on every labelled step, as Math-Shepherd's does);
2. one backbone: a character Llama pretrained on correct solutions of other problems;
3. two PRMs from that backbone with one recipe (head, aggregate, rate, steps, seed), through
   ``methods.train`` as ``stepq train --method prm`` runs them:
   - **step labels**: ``--snapshot N``, each step's hard Abs-Q label (Math-Shepherd's practice);
   - **outcomes**: the solutions the same annotation produced for the snapshot's training
     problems, as ``stepq train --method prm --set`` reads them by default (the outcome-
     supervised PRM paper's data: each problem's responses, its trajectory and the rollouts
     from the empty prefix, of problems solved 20-80% of the time): the outcome PRM at no
     extra annotation cost, trained on final answers alone;
4. both scored on held-out problems written from the synthetic policy's step truth (a
   ProcessBench file: every step before the first wrong one is right, the rest wrong): step
   ROC AUC, AUC within each step position (the position alone cannot earn it), the AUC of the
   position alone, and ProcessBench F1 with the threshold chosen on a second held-out file;
   95% bootstrap intervals over held-out problems, and the step AUCs' difference with a paired
   interval (both PRMs score the same steps).

    python -m bench.experiments.bench_prm_labels --seed 0   # one seed, one training: about an hour on one core
    python -m bench.experiments.bench_prm_labels --seed 0 --trainings 2 --ceiling --keep runs/prm --reuse
    BENCH=bench_prm_labels bash bench/experiments/seeds_gpu.sh   # three seeds side by side on a lent GPU
    python -m bench.experiments.bench_prm_labels --quick    # a smoke run

The defaults (8,000 annotated problems, 2,000 steps a PRM) are the size of docs/experiments/prm.md's
"Step labels against outcomes at 8,000 trajectories"; the first run's (``--problems 1000
--prm-steps 1000``) is the section below it.  Prints a table, then one JSON object on its last
line.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import emit, saved_result
from bench.experiments.bench_prm import Step, step_auc
from bench.experiments.judge_backbone import BackboneRecipe, built_backbone
from bench.experiments.judge_grpo_eval import prm_recipe
from bench.experiments.judge_heldout import write_processbench
from bench.experiments.lm_training import Device
from bench.experiments.stats import bootstrap, processbench_f1

# steps of different difficulty on small numbers, as the judge benchmark draws them
OP_ERROR_RATES = {"Add": 0.05, "Subtract": 0.25}
SET = "prm-labels"


def prepare(seed: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The annotated set, its snapshot, the held-out files and the backbone."""
    from stepq.embedded import annotate_in_process
    from stepq.migrations import upgrade
    from stepq.models import Database
    from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
    from stepq.trainer.snapshots.export import snapshot_records
    from stepq.workers.backends.synthetic_policy import SyntheticPolicy
    from stepq.workers.data.synthetic_set import synth_set

    started = time.perf_counter()
    url = f"sqlite:///{root / 'stepq.db'}"
    upgrade(url)
    db = Database(url)
    policy = {"error_rate": 0.15, "recovery_rate": args.recovery_rate, "op_error_rates": OP_ERROR_RATES}
    synth_set(db, SET, problems=args.problems, seed=seed, numbers="small", **policy)  # type: ignore[arg-type]
    annotate_in_process(db, SET, args.rollouts, worker="bench", rule="abs-q")
    snapshot = create_snapshot(db, SnapshotSpec((SET,), "abs-q", val_fraction=0.2, seed=seed, balanced=False))
    records = snapshot_records(db, snapshot)
    seen = frozenset(r["problem"] for part in records.values() for r in part)
    truth_policy = SyntheticPolicy(
        error_rate=0.15, recovery_rate=args.recovery_rate, op_error_rates=tuple(OP_ERROR_RATES.items())
    )
    write_processbench(root / "heldout.json", args.heldout, seed, truth_policy, seen, "small")
    write_processbench(root / "tune.json", args.heldout // 2, seed + 1000, truth_policy, seen, "small")
    backbone = root / "backbone"
    recipe = BackboneRecipe(seed, args.layers, args.width, args.pretrain_problems, args.pretrain_steps, "small")
    loss = built_backbone(backbone, recipe, Device(args.device))["loss"]
    db.engine.dispose()
    (root / PREPARED).write_text(json.dumps({"pretrain_loss": loss, "prepare_s": round(time.perf_counter() - started)}))
    return load_prepared(root)


PREPARED = "prepared.json"
"""Written last by ``prepare``: a seed's folder holding it is prepared (``--reuse`` takes it)."""


def load_prepared(root: Path) -> dict[str, Any]:
    """A prepared seed's folder read back: its set's one snapshot, the held-out samples and what
    the preparation measured.  A folder kept before ``prepared.json`` existed is read from the
    database and files alone (its preparation's loss and time unknown)."""
    from stepq.models import Database
    from stepq.models.snapshots import TRAIN, Snapshot
    from stepq.trainer.snapshots.export import snapshot_records

    url = f"sqlite:///{root / 'stepq.db'}"
    db = Database(url)
    with db.session() as session:
        (snapshot,) = session.query(Snapshot.id).all()
    records = snapshot_records(db, snapshot[0])
    db.engine.dispose()
    measured = json.loads((root / PREPARED).read_text()) if (root / PREPARED).exists() else {}
    return {
        "url": url,
        "snapshot": snapshot[0],
        "train_problems": sorted({r["problem"] for r in records[TRAIN]}),
        "train_steps": len(records[TRAIN]),
        "samples": json.loads((root / "heldout.json").read_text()),
        "pretrain_loss": measured.get("pretrain_loss"),
        "prepare_s": measured.get("prepare_s"),
    }


def both_prms(
    seed: int, args: argparse.Namespace, root: Path, prepared: dict[str, Any], training: int = 0
) -> dict[str, Any]:
    """The two PRMs, each scored on the held-out files.  Training ``t`` trains both from the same
    data and backbone under the training seed ``seed + 1000 t`` (its run folders ``prm-ARM-tT``;
    training 0's are ``prm-ARM``): what moves between trainings is the training itself.  A run
    folder that holds a finished run is taken as it is (the executor's resume)."""
    from stepq.models import Database
    from stepq.trainer import methods
    from stepq.trainer.methods.prm import set_outcomes
    from stepq.trainer.training.runs import TrainOptions

    db = Database(prepared["url"])
    training_seed = seed + 1000 * training
    suffix = f"-t{training}" if training else ""
    recipe = prm_recipe(root / "backbone", args.prm_steps, args.prm_lr, training_seed, args.prm_batch)
    train_problems = set(prepared["train_problems"])
    outcomes = [e for e in set_outcomes(db, SET) if e.problem in train_problems]
    arms = {
        "steps": methods.TrainingData(snapshot=str(prepared["snapshot"])),
        "outcomes": methods.TrainingData(
            records=outcomes, name=f"outcomes:{SET}:snapshot-{prepared['snapshot']}-train"
        ),
    }
    if args.ceiling and training == 0:  # one ceiling a seed
        arms["truth"] = methods.TrainingData(
            records=truth_examples(db, prepared["snapshot"]), name=f"truth:snapshot-{prepared['snapshot']}-train"
        )
    out: dict[str, Any] = {"training": training, "training_seed": training_seed, "outcome_solutions": len(outcomes)}
    scored: dict[str, list[list[Step]]] = {}
    for arm, data in arms.items():
        started = time.perf_counter()
        result = methods.train(db, "prm", recipe, data, root / f"prm-{arm}{suffix}", TrainOptions())
        train_s = time.perf_counter() - started
        figures, scored[arm] = score(result.final_model, root, prepared["samples"], seed)
        out[arm] = {**figures, "train_s": round(train_s)}
        print(f"  seed {seed} training {training} {arm}: {describe(out[arm])} (trained in {train_s:.0f} s)", flush=True)
    db.engine.dispose()
    out["step_auc_difference"] = paired_difference(scored["steps"], scored["outcomes"], seed)
    diff, (lo, hi) = out["step_auc_difference"]["value"], out["step_auc_difference"]["ci"]
    print(
        f"  seed {seed} training {training}: step AUC, step labels minus outcomes {diff:+.3f} [{lo:+.3f}, {hi:+.3f}]",
        flush=True,
    )
    return out


def truth_examples(db: Any, snapshot: int) -> list[Any]:
    """The ceiling's data: the step-label PRM's own training steps (the snapshot's training split,
    every labelled step of each trajectory), each with the synthetic policy's truth for its target
    instead of its Monte Carlo label: what the same PRM learns from these trajectories when the
    labels hold no noise.  Relabelled rows go through the one reader the step-label PRM uses."""
    from sqlalchemy import select

    from stepq.models.snapshots import TRAIN
    from stepq.models.trajectories import Chunk
    from stepq.trainer.prm.step_labels import examples_from_rows
    from stepq.trainer.snapshots.export import snapshot_records

    rows = snapshot_records(db, snapshot)[TRAIN]
    with db.session() as session:
        truth = dict(session.execute(select(Chunk.id, Chunk.ground_truth)).tuples().all())
    relabelled = [{**r, "label": "Positive" if truth[r["chunk_id"]] else "Negative"} for r in rows]
    return examples_from_rows(relabelled, "hard")


def paired_difference(first: Sequence[Sequence[Step]], second: Sequence[Sequence[Step]], seed: int) -> dict[str, Any]:
    """The step AUC of ``first`` minus ``second``'s on the same held-out problems, with a 95%
    interval that resamples the problems once for both (paired): both PRMs score the same steps,
    so their errors are correlated and two separate intervals overstate the doubt."""
    pairs = list(zip(first, second, strict=True))

    def difference(sample: Sequence[tuple[Sequence[Step], Sequence[Step]]]) -> float:
        return step_auc([a for a, _ in sample]) - step_auc([b for _, b in sample])

    return {"value": difference(pairs), "ci": bootstrap(pairs, difference, seed)}


def score(
    model: Path, root: Path, samples: Sequence[dict[str, Any]], seed: int
) -> tuple[dict[str, Any], list[list[Step]]]:
    """Step AUC (overall, within a position), the position's own AUC, and ProcessBench F1
    thresholded on the tuning file, as ``stepq eval processbench --judge prm`` scores; and the
    scored steps of each held-out problem (position, score, right)."""
    from stepq.trainer.evaluation import processbench as pb
    from stepq.trainer.evaluation.judge_spec import JudgeSpec, build_judge

    built = build_judge(JudgeSpec(kind="prm", model=str(model)))
    scored = built.judge.score_solutions([(s["problem"], s["steps"]) for s in samples])
    report = pb.evaluate([root / "heldout.json"], built.judge, scoring=True, tune_file=root / "tune.json")
    built.close()
    problems = [
        [(k, float(p), s["label"] == -1 or k < s["label"]) for k, p in enumerate(row) if p is not None]
        for s, row in zip(samples, scored, strict=True)
    ]
    positions = [[(k, -float(k), right) for k, _, right in steps] for steps in problems]
    pairs = [(s["label"], report["predictions"][s["id"]]) for s in samples]
    return {
        "step_auc": step_auc(problems),
        "step_auc_ci": bootstrap(problems, step_auc, seed),
        "within_position_auc": step_auc(problems, by_position=True),
        "within_position_auc_ci": bootstrap(problems, lambda ps: step_auc(ps, by_position=True), seed),
        "position_auc": step_auc(positions),
        "processbench_f1": processbench_f1(pairs),
        "processbench_f1_ci": bootstrap(pairs, processbench_f1, seed),
        "threshold": report["threshold"],
    }, problems


def describe(r: dict[str, Any]) -> str:
    lo, hi = r["step_auc_ci"]
    wlo, whi = r["within_position_auc_ci"]
    flo, fhi = r["processbench_f1_ci"]
    return (
        f"step AUC {r['step_auc']:.3f} [{lo:.3f}, {hi:.3f}], within a position {r['within_position_auc']:.3f} "
        f"[{wlo:.3f}, {whi:.3f}], ProcessBench F1 {r['processbench_f1']:.1f} [{flo:.1f}, {fhi:.1f}]"
    )


def one_seed(seed: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """A seed's preparation and its trainings: training 0's figures at the top level (the layout
    of the runs saved before ``--trainings``), every training's in ``trainings``."""
    run_dir = root / f"seed{seed}"
    if args.reuse and (run_dir / "stepq.db").exists() and (run_dir / "backbone" / "config.json").exists():
        prepared = load_prepared(run_dir)
        print(f"  seed {seed}: reusing the preparation in {run_dir}", flush=True)
    else:
        run_dir.mkdir(parents=True, exist_ok=False)
        prepared = prepare(seed, args, run_dir)
    print(
        f"  seed {seed}: snapshot {prepared['snapshot']} holds {prepared['train_steps']} training steps; "
        f"backbone loss {prepared['pretrain_loss']} (prepared in {prepared['prepare_s']} s)",
        flush=True,
    )
    trainings = [both_prms(seed, args, run_dir, prepared, t) for t in range(args.trainings)]
    labels = [s["label"] for s in prepared["samples"]]
    return {
        "seed": seed,
        "train_steps": prepared["train_steps"],
        "heldout_samples": len(labels),
        "heldout_without_error": sum(label == -1 for label in labels),
        "prepare_s": prepared["prepare_s"],
        **trainings[0],
        "trainings": trainings,
    }


def summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every training of every seed side by side: per arm the mean step AUC and its standard
    deviation between trainings (the spread the per-problem intervals leave out), and how many
    trainings put the step-label PRM above the outcome PRM with the paired interval clear of 0."""
    trainings = [t for run in runs for t in run.get("trainings", [run])]
    out: dict[str, Any] = {"trainings": len(trainings)}
    for arm in ("steps", "outcomes", "truth"):
        for figure in ("step_auc", "within_position_auc"):
            values = [t[arm][figure] for t in trainings if arm in t]
            if not values:
                continue
            out[f"{arm}_{figure}"] = {
                "mean": statistics.mean(values),
                "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
                "range": [min(values), max(values)],
            }
    # runs saved before the paired difference was measured have none
    differences = [t["step_auc_difference"] for t in trainings if "step_auc_difference" in t]
    out["paired_trainings"] = len(differences)
    out["steps_above"] = sum(d["value"] > 0 for d in differences)
    out["steps_above_clear_of_zero"] = sum(d["ci"][0] > 0 for d in differences)
    out["outcomes_above_clear_of_zero"] = sum(d["ci"][1] < 0 for d in differences)
    return out


def saved_runs(path: Path) -> list[dict[str, Any]]:
    """The runs a saved file holds: the docs' ``prm_labels*.json`` or a run's log."""
    return list(saved_result(path)["runs"])


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--seed", type=int, help="One seed (instead of --seeds).")
    ap.add_argument("--problems", type=int, default=8000, help="Annotated problems (one trajectory each).")
    ap.add_argument("--rollouts", type=int, default=8, help="M, rollouts a prefix.")
    ap.add_argument("--recovery-rate", type=float, default=0.3)
    ap.add_argument("--heldout", type=int, default=300, help="Held-out problems (one solution each).")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--pretrain-problems", type=int, default=2000)
    ap.add_argument("--pretrain-steps", type=int, default=1000)
    ap.add_argument("--prm-steps", type=int, default=2000, help="Steps of each PRM.")
    ap.add_argument("--prm-batch", type=int, default=16, help="Solutions a step.")
    ap.add_argument("--prm-lr", type=float, default=1e-3)
    ap.add_argument(
        "--device", default=None, help="Where the backbone pretrains (default: cuda if there is one; the PRMs too)."
    )
    ap.add_argument(
        "--trainings", type=int, default=1, help="Trainings of both PRMs a seed, on the same data and backbone."
    )
    ap.add_argument(
        "--ceiling",
        action="store_true",
        help="A third PRM, once a seed (training 0): the step-label PRM's training steps with the synthetic "
        "truth as targets (the figure noiseless labels of these trajectories reach).",
    )
    ap.add_argument("--keep", type=Path, help="Keep the databases and models here (a new folder).")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="With --keep: a seed whose folder holds its preparation is not prepared again; its finished "
        "trainings are taken as they are, so more --trainings add only the new ones.",
    )
    ap.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        help="Summarise saved runs instead: a run's log (its last line) or a saved JSON file.",
    )
    ap.add_argument("--quick", action="store_true", help="A smoke run: tiny sizes, one seed.")
    return ap


def main() -> None:
    from stepq.log_setup import setup_logging

    args = parser().parse_args()
    # the PRM's progress lines (a PRM trains for minutes); the annotation's stay quiet
    setup_logging("warning")
    logging.getLogger("stepq.trainer.prm").setLevel(logging.INFO)
    if args.from_json:
        runs = [r for path in args.from_json for r in saved_runs(path)]
        print(json.dumps(summary(runs), indent=1))
        return
    if args.reuse and args.keep is None:
        raise SystemExit("--reuse takes the seeds' folders from --keep")
    seeds = [args.seed] if args.seed is not None else [int(s) for s in args.seeds.split(",")]
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.quick:
        seeds = seeds[:1]
        args.problems, args.heldout, args.pretrain_problems, args.pretrain_steps, args.prm_steps = 40, 30, 50, 20, 10
        args.width, args.layers = 64, 1
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        for seed in seeds:
            results.append(one_seed(seed, args, root))
    print(json.dumps(summary(results), indent=1), flush=True)
    emit({"benchmark": "bench_prm_labels", "settings": {k: str(v) for k, v in vars(args).items()}, "runs": results})


if __name__ == "__main__":
    main()
