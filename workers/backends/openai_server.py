"""Any OpenAI-compatible ``/v1/completions`` server (``vllm serve``, SGLang, TGI, …).

Rollouts continue raw text, so this uses the completions endpoint, never chat: the context
is sent as the prompt exactly as stored.  Requests run with bounded concurrency; timeouts,
429 and 5xx are retried with exponential backoff (honouring ``Retry-After``).  Any other
HTTP status (a 400 for a context longer than the model's limit) is a permanent error of
that request, and a refused connection (no server there) fails at once as a transient
error: the work item is retried later by the queue, not held by a sleeping worker.
Token usage comes from the server's ``usage``.
"""

from __future__ import annotations

import json
import random
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from stepq.models.errors import GenerationError, masked
from stepq.workers.backends.base import Completion, GenerationRequest, SamplingParams, split_calls

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class ServerError(GenerationError):
    """The completions server failed (after retries, or with a non-retryable status)."""


@dataclass(frozen=True)
class ServerCall:
    """One HTTP request: a prompt with n samples from one seed."""

    request_index: int
    body: dict[str, Any]


def build_calls(
    requests: Sequence[GenerationRequest], params: SamplingParams, model: str, per_sample_seeds: bool
) -> list[ServerCall]:
    """One request per sample (exact per-sample seeds) or one per request (``n``, first seed)."""
    return [
        ServerCall(c.request_index, {"model": model, "prompt": c.prompt, **c.sampling})
        for c in split_calls(requests, params, per_sample_seeds)
    ]


def parse_response(payload: dict[str, Any], n: int) -> list[Completion]:
    """Completions in choice order; tokens from ``usage`` split evenly when n > 1 lacks detail."""
    choices = sorted(payload.get("choices") or [], key=lambda c: c.get("index", 0))
    if len(choices) != n:
        raise ServerError(f"server returned {len(choices)} choices, expected {n}")
    usage = payload.get("usage") or {}
    total = usage.get("completion_tokens")
    # one prompt per request, however many choices: its length is every choice's context
    prompt = usage.get("prompt_tokens")
    prompt_tokens = prompt if isinstance(prompt, int) else None
    out = []
    for choice in choices:
        text = choice.get("text")
        if not isinstance(text, str):
            raise ServerError("server returned a choice without text")
        tokens = total // n if isinstance(total, int) else len(text.split())
        out.append(Completion(text, tokens, choice.get("finish_reason") or "stop", prompt_tokens))
    return out


class OpenAICompletionsBackend:
    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        concurrency: int = 16,
        timeout_s: float = 600.0,
        max_retries: int = 6,
        backoff_s: float = 1.0,
        per_sample_seeds: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.shown_url = masked(self.base_url)  # what errors (kept in the database) may name
        self.model = model
        self.api_key = api_key
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.per_sample_seeds = per_sample_seeds
        self.retries = 0
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="stepq-openai")

    @classmethod
    def from_config(cls, config: dict[str, Any], api_key: str | None = None) -> OpenAICompletionsBackend:
        if not config.get("base_url") or not config.get("model"):
            from stepq.models.errors import ConfigError

            raise ConfigError("the openai backend needs base_url and model")
        return cls(
            config["base_url"],
            config["model"],
            api_key=config.get("api_key") or api_key,
            concurrency=int(config.get("concurrency", 16)),
            timeout_s=float(config.get("timeout_s", 600)),
            max_retries=int(config.get("max_retries", 6)),
            backoff_s=float(config.get("backoff_s", 1.0)),
            per_sample_seeds=bool(config.get("per_sample_seeds", True)),
        )

    @property
    def generator(self) -> str:
        return f"openai:{self.model}"

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
        calls = build_calls(requests, params, self.model, self.per_sample_seeds)
        results = list(self._pool.map(self._call, calls))
        out: list[list[Completion]] = [[] for _ in requests]
        for call, completions in zip(calls, results, strict=True):
            out[call.request_index].extend(completions)
        return out

    def _call(self, call: ServerCall) -> list[Completion]:
        payload = self._post("/completions", call.body)
        usage = payload.get("usage") or {}
        for key in self.usage:
            if isinstance(usage.get(key), int):
                self.usage[key] += usage[key]
        return parse_response(payload, call.body["n"])

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        for attempt in range(self.max_retries + 1):
            request = urllib.request.Request(self.base_url + path, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                if exc.code not in RETRY_STATUS or attempt == self.max_retries:
                    # scrubbed before it is cut: a server's error body may echo the key it was sent
                    detail = scrubbed(exc.read(8192).decode(errors="replace"), self.api_key)[:300]
                    raise ServerError(
                        f"{self.shown_url}{path}: HTTP {exc.code}: {detail}", permanent=exc.code not in RETRY_STATUS
                    ) from None
                wait = _retry_after(exc.headers.get("Retry-After")) or self._backoff(attempt)
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if _refused(exc):
                    raise ServerError(f"{self.shown_url}{path}: connection refused (is the server up?)") from None
                if attempt == self.max_retries:
                    raise ServerError(f"{self.shown_url}{path}: {exc}") from None
                wait = self._backoff(attempt)
            self.retries += 1
            time.sleep(wait)
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int) -> float:
        return self.backoff_s * (2**attempt) * (0.5 + random.random() / 2)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


_BEARER = re.compile(r"(Bearer\s+)\S+", re.IGNORECASE)


def scrubbed(text: str, secret: str | None) -> str:
    """``text`` with the key this backend sends (and any bearer token) replaced by ``***``: what a
    server says back becomes a work item's stored error and a log line."""
    if secret:
        text = text.replace(secret, "***")
    return _BEARER.sub(r"\1***", text)


def _refused(exc: BaseException) -> bool:
    reason = getattr(exc, "reason", exc)
    return isinstance(reason, ConnectionRefusedError) or isinstance(exc, ConnectionRefusedError)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
