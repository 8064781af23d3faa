"""The capacity sweep's data: each cell's labelled rows (annotated through the real task code,
a snapshot a cell), the held-out and tuning ProcessBench files a seed is scored on, and the
rows a judge is taught (all, a draw of equal size, or check rows kept off every problem taught
or scored elsewhere).  ``bench_judge_capacity`` runs the sweep on them; ``judge_reading`` reads
them back.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.experiments.judge_format import step_truth
from bench.experiments.judge_heldout import write_processbench
from bench.experiments.neural_policy import policy_model
from stepq.workers.labelling.labels import RULES

if TYPE_CHECKING:
    from bench.experiments.bench_judge_capacity import Cell

OP_ERROR_RATES = {"Add": 0.05, "Subtract": 0.25}  # bench_judge_grpo's --numbers small
ERROR_RATE = 0.15
"""The synthetic policy's error rate on the operations ``OP_ERROR_RATES`` does not name."""


def dump_rows(path: Path, rows: Any) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(rows, f)


def load_rows(path: Path) -> Any:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def prepare_labels(
    where: Path,
    seed: int,
    cells: list[Cell],
    recovery_rate: float,
    policy_dir: Path | None = None,
    balanced: bool = True,
) -> dict[str, Any]:
    """Annotate one set through the real task code (SQLite, in process) and write each cell's
    snapshot rows (``where / cell.data_key``), each with its Monte Carlo label and its synthetic
    truth.  ``cells`` share one ``annotation_key``; each further rule is planned on the same set
    as ``stepq run --rule`` plans it (the stored rollouts reused, only what that rule still needs
    sampled), Abs-Q first.  ``policy_dir``: the cells' neural policy, whose own samples are the
    trajectories and whose continuations the rollouts (``stepq generate`` and the hf backend),
    instead of the synthetic policy's.  ``balanced=False`` keeps every labelled row (a policy
    that never answers right labels every step Negative, which balancing empties)."""
    from stepq.embedded import annotate_in_process
    from stepq.migrations import upgrade
    from stepq.models import Database
    from stepq.models.snapshots import TRAIN, VALIDATION
    from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
    from stepq.trainer.snapshots.export import snapshot_records
    from stepq.workers.data.synthetic_set import synth_set

    first = cells[0]
    assert all(c.annotation_key == first.annotation_key for c in cells)
    info: dict[str, Any] = {}
    keep = ("problem_id", "problem", "history", "chunk", "label", "chunk_index", "q_before", "q_after")
    with tempfile.TemporaryDirectory() as scratch:
        url = f"sqlite:///{Path(scratch) / 'stepq.db'}"
        upgrade(url)
        db = Database(url)
        plan: dict[str, Any] = {}
        truth = synthetic_truth if policy_dir is None else written_truth
        if policy_dir is None:
            synth_set(
                db,
                "judge",
                problems=first.problems,
                seed=seed,
                error_rate=ERROR_RATE,
                recovery_rate=recovery_rate,
                op_error_rates=OP_ERROR_RATES,
                numbers="small",
            )
        else:
            started = time.perf_counter()
            from bench.experiments.budget_neural import sample_policy

            plan = sample_policy(db, "judge", seed, first.problems, policy_dir)
            info["sample_s"] = round(time.perf_counter() - started, 1)
        for rule in sorted({c.rule for c in cells}, key=tuple(RULES).index):
            started = time.perf_counter()
            annotate_in_process(db, "judge", first.m, worker="bench", rule=rule, **plan)
            info[f"annotate_s_{rule}"] = round(time.perf_counter() - started, 1)
            for cell in {c.data_key: c for c in cells if c.rule == rule}.values():
                spec = SnapshotSpec(
                    ("judge",),
                    rule,
                    val_fraction=0.2,
                    seed=seed,
                    balanced=balanced,
                    until_first_error=cell.form == "first-dead",
                )
                records = snapshot_records(db, create_snapshot(db, spec))
                out = where / cell.data_key
                out.mkdir(parents=True, exist_ok=True)
                for name, split in (("train", TRAIN), ("validation", VALIDATION)):
                    rows = [{**{k: r[k] for k in keep}, **truth(r)} for r in records[split]]
                    dump_rows(out / f"{name}.json.gz", rows)
                    info[f"{cell.data_key}_{name}"] = len(rows)
        db.engine.dispose()
    return info


def synthetic_truth(row: dict[str, Any]) -> dict[str, bool]:
    return {"truth": step_truth(row)}


def written_truth(row: dict[str, Any]) -> dict[str, bool]:
    """A model's step right with every step before it (``truth``) and alone (``local``); a step
    the checker cannot read (a model writes malformed steps, the synthetic policy never does) is
    not right."""
    from stepq.workers.backends.synthetic_policy import step_is_right, step_locally_right

    args = (row["problem"], row["history"], row["chunk"])
    return {"truth": step_is_right(*args) is True, "local": step_locally_right(*args) is True}


def policy_dir(policy: str, args: argparse.Namespace, data: Path) -> Path | None:
    """The cell's policy (``neural_policy.policy_model``); ``--quick`` a build of no skill."""
    if policy == "synthetic":  # no build, whatever the options hold
        return None
    return policy_model(policy, args.policy_cache, args.quick, data / "quick-policy")


HISTORY_KINDS = (("operand", 1.0), ("operation", 1.0), ("carry", 1.0))
"""The second held-out file's errors: the kinds a step alone does not show (an operand copied
from elsewhere, the wrong operation, a value carried wrong), each step's arithmetic right."""
HELDOUT_FILES = {"": (), "-kinds": HISTORY_KINDS}
"""Held-out and tuning file pairs by suffix: the policy's own errors (the step's result off)
and ``HISTORY_KINDS``."""


def prepare_heldout(out: Path, seed: int, samples: int, recovery_rate: float, exclude: frozenset[str]) -> None:
    """Each missing pair of held-out and tuning files (fresh problems and solutions a pair)."""
    from stepq.workers.backends.synthetic_policy import SyntheticPolicy

    out.mkdir(parents=True, exist_ok=True)
    for k, (suffix, kinds) in enumerate(HELDOUT_FILES.items()):
        if (out / f"heldout{suffix}.json").exists():
            continue
        rates = tuple(OP_ERROR_RATES.items())
        policy = SyntheticPolicy(
            error_rate=ERROR_RATE, recovery_rate=recovery_rate, op_error_rates=rates, error_kinds=kinds
        )
        base = seed + 2000 * k
        write_processbench(out / f"heldout{suffix}.json", samples, base, policy, exclude, "small")
        write_processbench(out / f"tune{suffix}.json", samples // 2, base + 1000, policy, exclude, "small")


def prepare(data: Path, seeds: list[int], cells: list[Cell], args: argparse.Namespace) -> None:
    """Every cell's labelled rows, and per seed the held-out and tuning files (problems that
    none of the seed's sets holds)."""
    for seed in seeds:
        where = data / f"seed{seed}"
        for key in sorted({c.annotation_key for c in cells}):
            group = [c for c in cells if c.annotation_key == key]
            if any(not (where / c.data_key / "train.json.gz").exists() for c in group):
                info = prepare_labels(where, seed, group, args.recovery_rate, policy_dir(group[0].policy, args, data))
                print(f"  seed {seed} {key}: {info}", flush=True)
        seen: set[str] = set()
        for key in sorted({c.data_key for c in cells}):
            for name in ("train", "validation"):
                seen.update(r["problem"] for r in load_rows(where / key / f"{name}.json.gz"))
        prepare_heldout(data / f"seed{seed}", seed, args.heldout, args.recovery_rate, frozenset(seen))


def equal_rows(data: Path, seed: int, cells: list[Cell]) -> int:
    """The fewest training rows any of the seed's cells has: the size every cell is taught on
    under ``--equal-rows``, so that a rule whose snapshot is larger is not compared with more data."""
    return min(len(load_rows(data / f"seed{seed}" / c.data_key / "train.json.gz")) for c in cells)


def take_rows(rows: list[dict[str, Any]], n: int | None, seed: int) -> list[dict[str, Any]]:
    """``n`` of the rows drawn without replacement under ``seed``, in their order (all if None)."""
    if n is None or n >= len(rows):
        return rows
    kept = sorted(random.Random(seed).sample(range(len(rows)), n))
    return [rows[i] for i in kept]


OWN_POLICY_SEED = 10_000
"""Added to a seed for the set ``judge_own_policy`` puts that seed's judge to work on (the
training sets use seeds 0, 1, 2)."""


def own_policy_problems(count: int, seed: int) -> list[str]:
    """The questions of that set's first ``count`` problems, as ``synth_set`` draws them (no
    database needed)."""
    from stepq.workers.data.synthetic_set import set_problems

    return [problem.question for _, problem in set_problems(OWN_POLICY_SEED + seed, count, "small")]


def taught_elsewhere(where: Path, seed: int, rows: list[dict[str, Any]], policy: str) -> frozenset[str]:
    """The problems check rows must not come from: the snapshot's, the held-out and tuning
    files', and those the judge is put to work on (the first 1,000 of ``bench_judge_at_work``'s
    held-out set; for the synthetic ``policy``, also of ``judge_own_policy``'s, which is added
    only there so that the neural judges' documented rows are drawn as they were)."""
    from bench.experiments.bench_judge_at_work import held_out_problems

    seen = {r["problem"] for r in rows}
    for name in ("heldout", "tune", "heldout-kinds", "tune-kinds"):
        seen.update(s["problem"] for s in json.loads((where / f"{name}.json").read_text()))
    seen.update(q for q, _ in held_out_problems(1000, seed))
    if policy == "synthetic":
        seen.update(own_policy_problems(1000, seed))
    return frozenset(seen)
