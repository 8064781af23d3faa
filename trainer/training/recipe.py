"""Training recipes: YAML whose ``trainer`` keys are the method's config fields (TRL's
``GRPOConfig`` or ``DPOConfig``, stepq's ``PRMConfig``), plus what stepq needs (the method,
the base model, reward names, the judge template)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepq.models.errors import ConfigError


def _check_precision(values: dict[str, Any]) -> None:
    """bf16/fp16 need an accelerator here (transformers' own error names no recipe key)."""
    wanted = [k for k in ("bf16", "fp16") if values.get(k)]
    if not wanted:
        return
    import torch

    if values.get("use_cpu") or not torch.cuda.is_available():
        key = wanted[0]
        raise ConfigError(
            f"recipe: trainer.{key}=true needs a CUDA GPU and this process has none; "
            f"pass --recipe-option trainer.{key}=false (or set '{key}: false' in the recipe)"
        )
    if values.get("bf16") and not torch.cuda.is_bf16_supported():
        raise ConfigError("recipe: trainer.bf16=true but this GPU has no bf16; pass --recipe-option trainer.bf16=false")


def _resolve_precision(values: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """The precision a run trains in, decided here rather than inherited: TRL's configs turn
    bf16 on when a recipe says nothing (its base config defaults it to True), which on a CPU
    means bf16 autocast: emulated where the CPU has no bf16 units (on this project's AVX2
    machine a GRPO step took 3.8x as long as in float32, ``bench/experiments/grpo_precision``)
    and not the float32 the recipe seemed to ask for.  A recipe silent on precision trains in
    float32 on the CPU and in TRL's default (bf16 where the GPU has it) on a GPU."""
    if "bf16" not in known or "bf16" in values or values.get("fp16"):
        return values
    import torch

    on_gpu = not values.get("use_cpu") and torch.cuda.is_available()
    return {**values, "bf16": bool(on_gpu and torch.cuda.is_bf16_supported())}


_EXPONENT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def _number_or_text(value: Any) -> Any:
    return float(value) if isinstance(value, str) and _EXPONENT.match(value.strip()) else value


def _option_value(option: str, raw: str) -> Any:
    """A command-line value read as YAML, with the numbers YAML 1.1 leaves as strings
    (``5e-5``) read as numbers."""
    import yaml

    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--recipe-option {option!r}: the value is not valid YAML ({exc})") from None
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def check_base_model(model: str) -> None:
    """Fail early, naming the model, when the base model cannot be loaded: a missing local
    folder, or a hub id this machine cannot reach (no network, no cache)."""
    local = Path(model).expanduser()
    if local.exists():
        if not (local / "config.json").exists():
            raise ConfigError(f"base model {model}: the folder has no config.json (not a saved model)")
        return
    looks_like_path = model.startswith((".", "/", "~")) or model.count("/") > 1 or model.endswith("/")
    if looks_like_path:
        raise ConfigError(f"base model {model}: no such folder (pass --model DIR with a saved model)")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"base model {model}: cannot be loaded (not a local folder, and the hub is unreachable or has no "
            f"such model: {reason}); pass --model DIR"
        ) from None


RECIPES = Path(__file__).resolve().parent.parent / "recipes"
OWN_KEYS = {"method", "model", "rewards", "judge_template", "conversational", "trainer"}


@dataclass(frozen=True)
class Recipe:
    text: str
    model: str
    method: str = "grpo"
    rewards: tuple[str, ...] = ("verdict-match",)
    judge_template: str | None = None
    conversational: bool = True
    trainer: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> Recipe:
        p = Path(path)
        if not p.exists() and (RECIPES / p.name).exists():
            p = RECIPES / p.name  # a shipped recipe by name, from any working directory
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read recipe {path}: {exc.strerror}") from None
        return cls.parse(text, source=str(path))

    @classmethod
    def parse(cls, text: str, source: str = "<recipe>") -> Recipe:
        import yaml

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"recipe {source} is not valid YAML: {exc}") from None
        return cls._from_mapping(data, text, source)

    @classmethod
    def _from_mapping(cls, data: Any, text: str, source: str) -> Recipe:
        if not isinstance(data, dict):
            raise ConfigError(f"recipe {source} must be a mapping")
        unknown = set(data) - OWN_KEYS
        if unknown:
            raise ConfigError(f"recipe {source}: unknown key(s) {', '.join(sorted(unknown))}")
        if not data.get("model"):
            raise ConfigError(f"recipe {source} names no base model ('model:')")
        trainer = data.get("trainer") or {}
        if not isinstance(trainer, dict):
            raise ConfigError(f"recipe {source}: 'trainer' must be a mapping of the method's config fields")
        # YAML 1.1 reads "5e-5" (no dot) as a string; a recipe author means the number
        trainer = {k: _number_or_text(v) for k, v in trainer.items()}
        method = str(data.get("method", "grpo"))  # checked against the registry where it trains
        rewards = data.get("rewards") or ["verdict-match"]
        return cls(
            text=text,
            model=str(data["model"]),
            method=method,
            rewards=tuple(rewards),
            judge_template=data.get("judge_template"),
            conversational=bool(data.get("conversational", True)),
            trainer=dict(trainer),
        )

    def with_options(self, options: Sequence[str] = (), model: str | None = None) -> Recipe:
        """This recipe with command-line overrides: ``KEY=VALUE`` for a top-level key
        (``judge_template=FILE``, ``conversational=false``) or ``trainer.FIELD=VALUE`` for
        the method's config (the value is read as YAML: ``false``, ``1e-5``, ``[a, b]``), and
        ``model`` for the base model.  The result's text is the effective recipe, so the run
        row records what really trained."""
        if not options and model is None:
            return self
        import yaml

        data = yaml.safe_load(self.text) or {}
        for option in options:
            key, sep, raw = option.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ConfigError(f"--recipe-option {option!r}: expected KEY=VALUE (e.g. trainer.bf16=false)")
            value = _option_value(option, raw)
            section, dot, field_name = key.partition(".")
            if dot:
                if section != "trainer" or not field_name:
                    raise ConfigError(f"--recipe-option {option!r}: nested keys live under 'trainer.' only")
                data.setdefault("trainer", {})
                data["trainer"][field_name] = value
            elif key == "trainer":
                raise ConfigError("--recipe-option: set trainer fields one at a time (trainer.FIELD=VALUE)")
            else:
                data[key] = value
        if model is not None:  # a local folder is recorded whole: the run row must name it from anywhere
            data["model"] = str(Path(model).resolve()) if Path(model).is_dir() else model
        text = yaml.safe_dump(data, sort_keys=False)
        return self._from_mapping(data, text, "--recipe-option")

    def config(self, config_cls: Any, output_dir: Path | None = None, **overrides: Any) -> Any:
        """The method's config dataclass with this recipe's fields; an unknown field is an
        error, not a silently ignored setting."""
        known = {f.name for f in dataclasses.fields(config_cls)}
        values = {**self.trainer, **overrides}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"recipe: {config_cls.__name__} has no field(s) {', '.join(unknown)} (see its docs; TRL renames them)"
            )
        _check_precision(values)
        values = _resolve_precision(values, known)
        if output_dir is not None:
            values.setdefault("report_to", "none")
            values["output_dir"] = str(output_dir)
        try:
            return config_cls(**values)
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"recipe: {config_cls.__name__} refuses these settings: {exc} "
                "(change the recipe, or override a field with --recipe-option trainer.FIELD=VALUE)"
            ) from None

    def expect(self, method: str) -> Recipe:
        """This recipe, checked to be one for ``method``."""
        if self.method != method:
            raise ConfigError(f"the recipe is for method '{self.method}', not '{method}' (its 'method:' key)")
        return self
