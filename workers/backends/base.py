"""The generation interface every backend implements.

It is shaped for batches: one call takes many contexts (every prefix of a trajectory)
with per-sample seeds (M of them each), so engines with prefix caching compute the
shared problem and chunk prefix once and the queue's per-call overhead is amortised.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from stepq.models.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 8192
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Refused here, before anything is stored: a NaN temperature reached PostgreSQL's JSON
        and came back as an internal error, a top_p of 7 sampled as 1."""
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)) or self.temperature < 0:
            raise ConfigError(f"temperature: {self.temperature!r} is not a finite number of 0 or more")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ConfigError(f"top_p: {self.top_p!r} is not in (0, 1]")
        if not (isinstance(self.max_tokens, int) and self.max_tokens >= 1):
            raise ConfigError(f"max_tokens: {self.max_tokens!r} is not a whole number of 1 or more")

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SamplingParams:
        known = {k: v for k, v in config.items() if k in {"temperature", "top_p", "max_tokens", "stop"}}
        if "stop" in known:
            known["stop"] = tuple(known["stop"])
        return cls(**known)

    def describe(self) -> str:
        return f"t={self.temperature:g},p={self.top_p:g},max={self.max_tokens}"


@dataclass(frozen=True)
class GenerationRequest:
    """Continue ``context`` (prompt + assistant prefix, as a raw completion) once per seed."""

    context: str
    seeds: tuple[int, ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def n(self) -> int:
        return len(self.seeds)


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: int
    """Tokens generated."""
    finish_reason: str = "stop"
    prompt_tokens: int | None = None
    """Tokens of the context it continued, where the engine reports them (the prefill: an
    early prefix's rollout generates many tokens from a short context, a late one few from
    a long context)."""


@runtime_checkable
class GenerationBackend(Protocol):
    """A policy that continues raw text; ``generator`` is recorded on every row it writes."""

    name: str

    @property
    def generator(self) -> str: ...

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
        """One list of ``request.n`` completions per request, in order."""
        ...

    def close(self) -> None: ...


def generator_id(backend: GenerationBackend, params: SamplingParams) -> str:
    """The identity recorded on rows: which policy, with which sampling settings.  Two
    samples are draws of the same distribution only when these are equal."""
    return f"{backend.generator}[{params.describe()}]"


@dataclass(frozen=True)
class EngineCall:
    """One prompt for an engine or server, with its sampling settings (``n`` and ``seed``)."""

    request_index: int
    prompt: str
    sampling: dict[str, Any]


def split_calls(
    requests: Sequence[GenerationRequest], params: SamplingParams, per_sample_seeds: bool
) -> list[EngineCall]:
    """Per-sample seeds: one call per sample (``n=1, seed=s``), so sample j of a prefix is the
    same draw on every retry; otherwise one call per request with ``n`` samples and its first
    seed.  The sampling keys are those of vLLM's SamplingParams and the OpenAI API alike."""
    base: dict[str, Any] = {"temperature": params.temperature, "top_p": params.top_p, "max_tokens": params.max_tokens}
    if params.stop:
        base["stop"] = list(params.stop)
    calls: list[EngineCall] = []
    for r, req in enumerate(requests):
        if per_sample_seeds:
            calls.extend(EngineCall(r, req.context, {**base, "n": 1, "seed": seed}) for seed in req.seeds)
        elif req.n:
            calls.append(EngineCall(r, req.context, {**base, "n": req.n, "seed": req.seeds[0]}))
    return calls
