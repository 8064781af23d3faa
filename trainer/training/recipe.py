"""Training recipes: YAML whose ``trainer`` keys are the method's config fields (TRL's
``GRPOConfig`` or ``DPOConfig``, stepq's ``PRMConfig``), plus what stepq needs (the method,
the base model, reward names, the judge template)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepq.models.errors import ConfigError

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
METHODS = ("grpo", "dpo", "prm")
STEPQ_KEYS = {"method", "model", "rewards", "judge_template", "conversational", "trainer"}


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
        if not isinstance(data, dict):
            raise ConfigError(f"recipe {source} must be a mapping")
        unknown = set(data) - STEPQ_KEYS
        if unknown:
            raise ConfigError(f"recipe {source}: unknown key(s) {', '.join(sorted(unknown))}")
        if not data.get("model"):
            raise ConfigError(f"recipe {source} names no base model ('model:')")
        trainer = data.get("trainer") or {}
        if not isinstance(trainer, dict):
            raise ConfigError(f"recipe {source}: 'trainer' must be a mapping of the method's config fields")
        method = str(data.get("method", "grpo"))
        if method not in METHODS:
            raise ConfigError(f"recipe {source}: unknown method '{method}' (one of: {', '.join(METHODS)})")
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
        if output_dir is None:
            return config_cls(**values)
        values.setdefault("report_to", "none")
        return config_cls(output_dir=str(output_dir), **values)

    def grpo_config(self, output_dir: Path, **overrides: Any) -> Any:
        from trl import GRPOConfig

        return self.config(GRPOConfig, output_dir, **overrides)

    def expect(self, method: str) -> Recipe:
        """This recipe, checked to be one for ``method``."""
        if self.method != method:
            raise ConfigError(f"the recipe is for method '{self.method}', not '{method}' (its 'method:' key)")
        return self
