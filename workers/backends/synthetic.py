"""The synthetic arithmetic policy as a generation backend (no model weights needed)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from stepq.models import queries
from stepq.models.errors import ConfigError
from stepq.workers.backends.base import Completion, GenerationRequest, SamplingParams
from stepq.workers.backends.synthetic_policy import ERROR_KINDS, SyntheticPolicy, is_synthetic_question


class SyntheticBackend:
    """Continues prompts of synthetic arithmetic problems; ``latency_s`` per completion
    simulates GPU time so crash and scheduling tests have something to interrupt."""

    name = "synthetic"

    def __init__(
        self,
        error_rate: float = 0.1,
        recovery_rate: float = 0.001,
        latency_s: float = 0.0,
        *,
        op_error_rates: dict[str, float] | None = None,
        slip_rate: float = 0.0,
        step_separator: str = "\n\n",
        error_kinds: dict[str, float] | None = None,
    ) -> None:
        unknown = set(error_kinds or {}) - set(ERROR_KINDS)
        if unknown:
            raise ConfigError(f"unknown error kind(s) {sorted(unknown)} (one of: {', '.join(ERROR_KINDS)})")
        if any(w <= 0 for w in (error_kinds or {}).values()):
            raise ConfigError(f"error kinds' weights must be positive, not {error_kinds}")
        self.policy = SyntheticPolicy(
            error_rate=error_rate,
            recovery_rate=recovery_rate,
            op_error_rates=tuple(sorted((op_error_rates or {}).items())),
            slip_rate=slip_rate,
            step_separator=step_separator,
            error_kinds=tuple(sorted((error_kinds or {}).items())),
        )
        self.latency_s = latency_s

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SyntheticBackend:
        return cls(
            error_rate=float(config.get("error_rate", 0.1)),
            recovery_rate=float(config.get("recovery_rate", 0.001)),
            latency_s=float(config.get("latency_s", 0.0)),
            op_error_rates={str(k): float(v) for k, v in (config.get("op_error_rates") or {}).items()},
            slip_rate=float(config.get("slip_rate", 0.0)),
            step_separator=str(config.get("step_separator", "\n\n")),
            error_kinds={str(k): float(v) for k, v in (config.get("error_kinds") or {}).items()},
        )

    @property
    def generator(self) -> str:
        p = self.policy
        extra = "".join(f",{op.split()[0].lower()}={e:g}" for op, e in p.op_error_rates)
        extra += f",slip={p.slip_rate:g}" if p.slip_rate else ""
        extra += ",lines" if p.step_separator == "\n" else ""
        extra += "".join(f",{kind}-errors={w:g}" for kind, w in p.error_kinds)
        return f"synthetic(err={p.error_rate:g},rec={p.recovery_rate:g}{extra})"

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
        out: list[list[Completion]] = []
        for req in requests:
            prompt, _, prefix = req.context.rpartition("Solution:\n")
            prompt += "Solution:\n"
            texts = [self.policy.continue_text(prompt, prefix, seed) for seed in req.seeds]
            context = len(req.context.split())  # one token a word, as it counts what it writes
            out.append([Completion(t, len(t.split()), prompt_tokens=context) for t in texts])
        if self.latency_s:
            time.sleep(self.latency_s * sum(r.n for r in requests))
        return out

    def close(self) -> None:
        return None


def require_synthetic_problems(session: Any, set_id: int, backend: str, set_name: str) -> None:
    """The synthetic backend continues only synthetic arithmetic problems: say so before
    anything is stored or sampled, not as a worker's ValueError."""
    if backend != "synthetic":
        return
    first = queries.set_problems(session, set_id, limit=1)
    if first and not is_synthetic_question(first[0].question):
        raise ConfigError(
            f"set '{set_name}' holds problems the synthetic backend cannot continue (it knows only 'stepq synth' "
            "problems): choose --backend vllm, openai or hf with --model"
        )
