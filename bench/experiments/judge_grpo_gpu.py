"""GRPO of the judge benchmark on one lent GPU: its kept seeds carried there, and each GRPO
run sized to the time the lease leaves.

A lease is minutes long and carries at most 64 MiB, so the seeds are prepared here
(``bench_judge_grpo --keep DIR --steps 0``), cut to what GRPO and the evaluation read, and
every seed and rule trains at once on the one GPU (``judge_grpo_gpu.sh``), for as many steps as
a short probe says fit:

    python -m bench.experiments.judge_grpo_gpu slim runs-pos/seed0-abs-q gpu-grpo/runs-pos/seed0-abs-q
    python -m bench.experiments.judge_grpo_gpu probe gpu-grpo/runs-pos/seed0-abs-q 14 cuda --prompts-per-step 64
    bash bench/experiments/judge_grpo_gpu.sh 520 64          # on the GPU machine, from the repository root
    python -m bench.experiments.judge_grpo_gpu evaluate runs-pos/seed2-abs-q MODEL 2    # a model brought back

GRPO trains in float32 on the GPU, as on the CPU: the same objective and precision (not the
same draws).
"""

from __future__ import annotations

import itertools
import json
import shutil
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import Any

KEPT = ("base", "heldout.json", "tune.json", "template.txt", "prepared.json")
# what GRPO and the evaluation never read: the snapshot keeps its own rows and texts
DROPPED = ("rollouts", "rollout_work", "q_values", "progress_samples", "chunk_labels", "chunks", "trajectories")


def slim(src: Path, dst: Path) -> int:
    """Copy a kept seed with its database cut to the snapshot, problems and sets; its size in bytes."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        if (src / name).is_dir():
            shutil.copytree(src / name, dst / name, dirs_exist_ok=True)
        else:
            shutil.copyfile(src / name, dst / name)
    with sqlite3.connect(src / "stepq.db") as conn:
        conn.execute("VACUUM INTO ?", (str(dst / "stepq.db"),))
    conn = sqlite3.connect(dst / "stepq.db")
    conn.execute("PRAGMA foreign_keys=OFF")
    for table in DROPPED:
        conn.execute(f"DELETE FROM {table}")
    conn.commit()
    conn.execute("VACUUM")
    conn.close()
    return sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())


def probe(run_dir: Path, steps: int, device: str, flags: list[str]) -> dict[str, object]:
    """Seconds a GRPO step takes here, with the benchmark's recipe and ``methods.train``, on a
    scratch copy of the seed (its training run and model are thrown away)."""
    from bench.experiments.bench_judge_grpo import grpo_recipe, parser
    from stepq.migrations import upgrade
    from stepq.models import Database
    from stepq.trainer import methods
    from stepq.trainer.training.runs import TrainOptions

    args = parser().parse_args(["--steps", str(steps), "--device", device, *flags])
    prepared = json.loads((run_dir / "prepared.json").read_text())
    scratch = Path("/tmp") / f"probe-{run_dir.name}"
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(run_dir, scratch, ignore=shutil.ignore_patterns("grpo-*", "supervised-*", "backbone", "prm"))
    url = f"sqlite:///{scratch / 'stepq.db'}"
    upgrade(url)
    stamps: list[float] = []
    started = time.perf_counter()
    recipe = grpo_recipe(args, scratch, prepared["completion"], 0)
    db, out = Database(url), scratch / "grpo"
    snapshot = prepared["snapshot"]
    options = TrainOptions(on_step=lambda: stamps.append(time.perf_counter()))
    methods.train(db, "grpo", recipe, methods.TrainingData(snapshot=str(snapshot)), out, options)
    gaps = [b - a for a, b in itertools.pairwise(stamps[2:])]  # past the first steps' warm-up
    shutil.rmtree(scratch, ignore_errors=True)
    return {
        "probe": str(run_dir),
        "steps": len(stamps),
        "setup_s": round(stamps[0] - started, 1) if stamps else None,
        "step_s": round(statistics.median(gaps), 3) if gaps else None,
    }


def evaluate_elsewhere(run_dir: Path, model: Path, seed: int) -> dict[str, Any]:
    """A judge trained on another machine (its run row stays there), scored on the kept seed
    exactly as ``bench_judge_grpo`` scores the judges it trains."""
    from bench.experiments.judge_grpo_eval import evaluate_kept, kept_seed
    from stepq.models import Database

    prepared = json.loads((run_dir / "prepared.json").read_text())
    db = Database(f"sqlite:///{run_dir / 'stepq.db'}")
    try:
        kept = kept_seed(db, run_dir, prepared)
    finally:
        db.dispose()
    return evaluate_kept(model, kept, seed)


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[1] not in ("slim", "probe", "evaluate"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "slim":
        print(f"{sys.argv[3]}: {slim(Path(sys.argv[2]), Path(sys.argv[3])) // 1024} KiB", flush=True)
    elif sys.argv[1] == "evaluate":
        print(json.dumps(evaluate_elsewhere(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))), flush=True)
    else:
        print(json.dumps(probe(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:])), flush=True)


if __name__ == "__main__":
    main()
