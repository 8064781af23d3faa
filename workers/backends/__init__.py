"""Generation backends behind one protocol, built by name from a problem set's config."""

from __future__ import annotations

from typing import Any

from stepq.models.errors import ConfigError
from stepq.workers.backends.base import Completion, GenerationBackend, GenerationRequest, SamplingParams, generator_id

REQUIRED = {"openai": ("base_url", "model"), "vllm": ("model",), "hf": ("model",)}


def check_config(name: str, config: dict[str, Any]) -> None:
    """Refuse a backend config that could never generate, before it is stored or used."""
    if name not in BACKENDS:
        raise ConfigError(f"unknown generation backend '{name}' (one of: {', '.join(BACKENDS)})")
    missing = [k for k in REQUIRED.get(name, ()) if not config.get(k)]
    if missing:
        flags = " and ".join(f"--{k.replace('_', '-')}" for k in missing)
        raise ConfigError(f"the {name} backend needs {flags}")


SECRET_WORDS = ("key", "token", "password", "secret")
"""A stored option whose name holds one of these is a credential."""


def check_storable(config: dict[str, Any], what: str) -> None:
    """Refuse a backend config that would put a secret in the database in clear (a set's backend
    and a search's judge are stored, and shown by status and exports): credentials reach the
    processes that generate through their environment (``STEPQ_OPENAI_API_KEY``), never a row."""
    from urllib.parse import urlsplit

    for name, value in config.items():
        if any(word in name.lower() for word in SECRET_WORDS):
            raise ConfigError(
                f"{what}: option '{name}' would be stored in the database in clear; give the key to the processes "
                "that generate as STEPQ_OPENAI_API_KEY instead"
            )
        if isinstance(value, str) and "://" in value:
            try:
                password = urlsplit(value).password
            except ValueError:
                password = None
            if password:
                raise ConfigError(
                    f"{what}: '{name}' holds a password in its URL, which would be stored in the database in clear; "
                    "give the server's key as STEPQ_OPENAI_API_KEY (a bearer token) instead"
                )


INSTALLED_BY = {"vllm": (("vllm",), "vllm"), "hf": (("torch", "transformers"), "hf")}
"""The packages a backend imports when it is built, and the extra that installs them."""


def check_installed(name: str) -> None:
    """Refuse, before any work is taken, a backend whose packages this machine lacks: a worker
    that could only fail every task would otherwise say ready and take them all.  (Storing a
    set's backend needs no such check: the machine that annotates need not be the one that
    generates.)"""
    import importlib.util

    modules, extra = INSTALLED_BY.get(name, ((), ""))
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"the {name} backend needs {module}, which is not installed here: pip install 'stepq[{extra}]'"
            )


def make_backend(name: str, config: dict[str, Any] | None = None, *, api_key: str | None = None) -> GenerationBackend:
    """Build a backend; imports lazily so a worker only loads what it uses.  ``api_key``: the
    openai backend's key (the settings' ``openai_api_key``), unless its config names one."""
    config = config or {}
    check_config(name, config)
    if name == "synthetic":
        from stepq.workers.backends.synthetic import SyntheticBackend

        return SyntheticBackend.from_config(config)
    if name == "openai":
        from stepq.workers.backends.openai_server import OpenAICompletionsBackend

        return OpenAICompletionsBackend.from_config(config, api_key=api_key)
    if name == "vllm":
        from stepq.workers.backends.vllm_engine import VLLMBackend

        return VLLMBackend.from_config(config)
    if name == "hf":
        from stepq.workers.backends.hf import HFBackend

        return HFBackend.from_config(config)
    raise ConfigError(f"unknown generation backend '{name}' (one of: {', '.join(BACKENDS)})")


BACKENDS = ("synthetic", "openai", "vllm", "hf")


def named_model(name: str, config: dict[str, Any]) -> str | None:
    """The model a set's backend config names, as its backend's ``generator`` says it
    (``vllm:/weights/qwen``), without loading anything; None where no model is named (the
    synthetic policy).  A worker whose own engine serves another model refuses the set."""
    model = config.get("model")
    return f"{name}:{model}" if name != "synthetic" and model else None


def expected_generator(name: str, config: dict[str, Any], worker: str) -> str | None:
    """The generator a worker of backend ``worker`` must be to sample a set: the model its config
    names, or for a synthetic worker on a synthetic set the policy the set's config describes
    (cheap to build, and the set's only identity: left to the first writer, a worker of another
    policy that wrote first pinned the set to itself and the matching worker was refused).  The
    synthetic policy served through a server (``stepq serve-synthetic``) is another backend's
    model: there the first write still pins the set."""
    if name == "synthetic":
        return make_backend(name, config).generator if worker == name else None
    return named_model(name, config)


def serves_model(backend: GenerationBackend, named: str) -> bool:
    """Whether ``backend`` is the model ``named`` (a stand-in engine's note aside)."""
    return backend.generator.split(" (", 1)[0] == named


__all__ = ["Completion", "GenerationBackend", "GenerationRequest", "SamplingParams", "generator_id", "make_backend"]
