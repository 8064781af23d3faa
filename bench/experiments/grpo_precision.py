"""What TRL's default precision cost GRPO on a CPU: the judge benchmark's GRPO step in float32
(what stepq trains a recipe silent on precision in, on a CPU) against bf16 autocast (what TRL
alone does there: its configs default ``bf16`` to true), on one kept seed, one run, same load.

    python -m bench.experiments.grpo_precision runs-pos/seed0-abs-q 6 --prompts-per-step 64

The kept seed is ``bench_judge_grpo --keep DIR --steps 0``'s.  To reproduce TRL's default this
script lifts stepq's refusal of bf16 on a CPU for its second probe (nowhere else does).  Prints
both probes and the ratio as one JSON object.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, cast

from bench.common import emit


def compare(run_dir: Path, steps: int, flags: list[str]) -> dict[str, Any]:
    import bench.experiments.bench_judge_grpo as bench_grpo
    import stepq.trainer.training.recipe as recipe_module
    from bench.experiments.judge_grpo_gpu import probe

    float32 = probe(run_dir, steps, "cpu", flags)
    benchmark_recipe, check = bench_grpo.grpo_recipe, recipe_module._check_precision
    bench_grpo.grpo_recipe = lambda *a, **kw: benchmark_recipe(*a, **kw).with_options(["trainer.bf16=true"])
    recipe_module._check_precision = lambda values: None
    try:
        autocast = probe(run_dir, steps, "cpu", flags)
    finally:
        bench_grpo.grpo_recipe, recipe_module._check_precision = benchmark_recipe, check
    return {
        "benchmark": "grpo_precision",
        "float32": float32,
        "bf16_autocast": autocast,
        "bf16_over_float32": round(cast(float, autocast["step_s"]) / cast(float, float32["step_s"]), 2),
    }


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    emit(compare(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]))


if __name__ == "__main__":
    main()
