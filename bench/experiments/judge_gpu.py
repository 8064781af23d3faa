"""The capacity check on one GPU: the judge benchmark's supervised training on CUDA in bf16,
with a deeper, wider backbone and more data than 2 CPU cores allow, reporting the figures
``bench_judge_capacity`` reports.

It needs PyTorch, transformers, and what teaching a judge through stepq's ``sft`` method needs
(TRL, datasets, SQLAlchemy and alembic for the throwaway SQLite database its runs are recorded
in); no vLLM, server or model weights (it builds the backbone).  The labelled rows come from
stepq's real annotation code, run where stepq is installed, and travel as files:

    # here (stepq installed), once: the sets annotated, snapshotted and written to gpu-data/
    python -m bench.experiments.bench_judge_capacity --prepare-only --data gpu-data --seeds 0 \\
        --cells none/first-dead/6/16000/8,recompute/first-dead/6/16000/8
    # on the GPU machine (stepq's dependencies carried as wheels: docs/experiments/active.md); one
    # cell took 204 s on an H100 at these defaults when the judge was taught by the benchmark's own
    # loop (the backbone 57 s, each judge 60 s to teach and 7-17 s to score):
    python -m bench.experiments.judge_gpu --data gpu-data --seeds 0 \\
        --cells none/first-dead/6/16000/8,recompute/first-dead/6/16000/8
    # the same code at tiny size on CPU (what the test runs):
    python -m bench.experiments.judge_gpu --device cpu --quick

docs/experiments/judge_grpo.md ("Capacity") holds the figures and the card they ran on.
"""

from __future__ import annotations

from bench.experiments.bench_judge_capacity import parser, run
from bench.experiments.judge_capacity import Device

# 47 ms a step on an H100 (launch-bound at this size): 4,000 steps a stage ran past 8 minutes
GPU_DEFAULTS = {"width": 256, "batch": 64, "eval_batch": 512, "steps": 1500, "pretrain_steps": 1500, "lr": 5e-4}


def main() -> None:
    ap = parser()
    ap.description = __doc__.splitlines()[0]
    ap.add_argument("--device", default="cuda", help="cuda (bf16 autocast) or cpu (float32, for a check).")
    ap.set_defaults(**GPU_DEFAULTS)
    args = ap.parse_args()
    device = Device(args.device, bf16=args.device.startswith("cuda"))
    if device.bf16:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --device cpu for a check on CPU")
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    if args.quick:
        args.width, args.batch, args.eval_batch = 64, 16, 64
    run(args, device, benchmark="judge_gpu")


if __name__ == "__main__":
    main()
