"""Rollouts/s through stepq's vLLM backend vs. bare ``LLM.generate``, on the same engine,
prompts and seeds, and the effect of trajectories per engine call (``STEPQ_ITEMS_PER_TASK``).

    .venv-vllm/bin/python -m bench.ops.bench_vllm [--trajectories 32] [--m 8] [--max-tokens 32]

Runs in the vLLM environment (``bash scripts/vllm-env.sh``) on a tiny Llama built here (CPU,
random weights: the figures are about the backend's own overhead and batching, not a model's
speed).  Each trajectory has 6 prefixes (StepWiser's shape is ~7 chunks) sampled M times with
per-sample seeds.  "bare" hands every (prompt, seed) to one ``LLM.generate`` call, as a
hand-written script would; "backend" goes through ``VLLMBackend.generate`` (request building,
``SamplingParams``, reading outputs back), with k trajectories per call for k in 1, 4, 16.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trajectories", type=int, default=32)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()

    from bench.common import emit
    from stepq.trainer.tiny_model import build_tiny_llama
    from stepq.workers.backends import GenerationRequest, SamplingParams
    from stepq.workers.backends.vllm_engine import VLLMBackend
    from stepq.workers.seeds import derive_seed

    model = build_tiny_llama(Path(tempfile.mkdtemp(prefix="stepq-bench-llama-")))
    backend = VLLMBackend(
        str(model), gpu_memory_utilization=0.1, dtype="float32", max_model_len=1024,
        engine_options={"enforce_eager": True},
    )  # fmt: skip
    params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens)
    trajectories = []
    for t in range(args.trajectories):
        prompt = f"Problem: What is {t} + 7?\nSolution:\n"
        steps = [f"Step {k + 1}: {t + k} + 1 = {t + k + 1}.\n\n" for k in range(5)]
        prefixes = [prompt + "".join(steps[:k]) for k in range(6)]
        seeds = [tuple(derive_seed(0, t, k, j) for j in range(args.m)) for k in range(6)]
        trajectories.append([GenerationRequest(p, s) for p, s in zip(prefixes, seeds, strict=True)])
    rollouts = args.trajectories * 6 * args.m
    # Warm the engine (first-call compilation, caches) outside the timings.
    backend.generate(trajectories[0][:1], params)

    def bare() -> float:
        prompts, sampling = [], []
        for reqs in trajectories:
            for r in reqs:
                for seed in r.seeds:
                    prompts.append(r.context)
                    sampling.append(
                        backend.sampling_factory(n=1, seed=seed, temperature=1.0, top_p=1.0, max_tokens=args.max_tokens)
                    )
        start = time.perf_counter()
        backend.engine.generate(prompts, sampling, use_tqdm=False)
        return time.perf_counter() - start

    def through_backend(k: int) -> float:
        start = time.perf_counter()
        for i in range(0, len(trajectories), k):
            backend.generate([r for reqs in trajectories[i : i + k] for r in reqs], params)
        return time.perf_counter() - start

    result: dict[str, object] = {"rollouts": rollouts, "m": args.m, "max_tokens": args.max_tokens}
    bare_s = min(bare(), bare())
    result["bare_rollouts_per_s"] = round(rollouts / bare_s, 1)
    for k in (1, 4, 16):
        took = min(through_backend(k), through_backend(k))
        result[f"backend_k{k}_rollouts_per_s"] = round(rollouts / took, 1)
        result[f"backend_k{k}_vs_bare"] = round(bare_s / took, 3)
        print(k, result, flush=True)
    backend.close()
    emit(result)


if __name__ == "__main__":
    main()
