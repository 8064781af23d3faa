"""Checks of the vLLM backend on a real engine, run by the vLLM environment's Python.

    .venv-vllm/bin/python tests/vllm_engine_checks.py MODEL_DIR OUT.json

``tests/test_vllm.py`` runs this (vLLM and the training stack need different pins, so they live
in separate environments) and asserts on what it writes.  Everything here talks to the real
engine: what it received (prompt token ids), its seeds, ``n``, stop strings, finish reasons,
token counts, the chat template, and shutdown.  Guarded by ``__main__``: the engine starts its
core process by spawn, which imports this module again.
"""

from __future__ import annotations

import json
import sys
import time


def main(model: str, out_path: str) -> None:
    from transformers import AutoTokenizer

    from stepq.workers.backends import GenerationRequest, SamplingParams
    from stepq.workers.backends.vllm_engine import VLLMBackend

    tokenizer = AutoTokenizer.from_pretrained(model)
    context = "Problem: What is 2 + 3?\nSolution:\nStep 1: 2 + 3 = 5.\n\n"
    results: dict[str, object] = {}

    def backend() -> VLLMBackend:
        return VLLMBackend(
            model,
            gpu_memory_utilization=0.1,
            dtype="float32",
            max_model_len=1024,
            engine_options={"enforce_eager": True},
        )

    started = time.monotonic()
    first = backend()
    results["startup_s"] = round(time.monotonic() - started, 1)
    params = SamplingParams(temperature=1.0, max_tokens=24, stop=("\n",))
    a = first.generate([GenerationRequest(context, (11, 12, 13)), GenerationRequest(context + "Step", (11,))], params)
    results["n_per_request"] = [len(x) for x in a]
    results["texts"] = [c.text for c in a[0]]
    results["finish_reasons"] = sorted({c.finish_reason for row in a for c in row})
    results["stop_in_text"] = any("\n" in c.text for row in a for c in row)
    results["tokens"] = [c.tokens for row in a for c in row]
    # A batch far above one engine step's token budget, every sample seeded (on the CPU build
    # this needs chunked prefill off: the backend sees to it).
    big = [GenerationRequest(context * 4 + f"Step {i}:", tuple(range(i, i + 8))) for i in range(60)]
    results["big_batch"] = sum(len(row) for row in first.generate(big, SamplingParams(temperature=1.0, max_tokens=4)))
    long = first.generate([GenerationRequest(context, (5,))], SamplingParams(temperature=1.0, max_tokens=7))
    results["length_finish"] = (long[0][0].finish_reason, long[0][0].tokens)
    # What the engine received: the context's own token ids, no BOS added to a raw prompt.
    outputs = first.engine.generate([context], first.sampling_factory(n=1, seed=1, max_tokens=1), use_tqdm=False)
    results["prompt_ids_exact"] = (
        list(outputs[0].prompt_token_ids) == tokenizer(context, add_special_tokens=False)["input_ids"]
    )
    results["bos_id"] = tokenizer.bos_token_id
    results["first_prompt_id"] = outputs[0].prompt_token_ids[0]
    formatted = first.format_prompt("What is 2 + 3?")
    results["chat_template_once"] = formatted.count("<|user|>") == 1 and formatted.endswith("<|assistant|>")
    started = time.monotonic()
    first.close()
    results["close_s"] = round(time.monotonic() - started, 1)
    again = backend()  # a new engine: per-sample seeds give the same draws
    b = again.generate([GenerationRequest(context, (11, 12, 13))], params)
    results["same_after_restart"] = [c.text for c in b[0]] == results["texts"]
    again.close()
    with open(out_path, "w") as f:
        json.dump(results, f)
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
