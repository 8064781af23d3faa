"""Training recipes: YAML whose ``trainer`` keys are TRL config fields, plus what stepq needs
(the base model, reward names, the judge template)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepq.models.errors import ConfigError

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
STEPQ_KEYS = {"model", "rewards", "judge_template", "conversational", "trainer"}


@dataclass(frozen=True)
class Recipe:
    text: str
    model: str
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
            raise ConfigError(f"recipe {source}: 'trainer' must be a mapping of GRPOConfig fields")
        rewards = data.get("rewards") or ["verdict-match"]
        return cls(
            text=text,
            model=str(data["model"]),
            rewards=tuple(rewards),
            judge_template=data.get("judge_template"),
            conversational=bool(data.get("conversational", True)),
            trainer=dict(trainer),
        )

    def grpo_config(self, output_dir: Path, **overrides: Any) -> Any:
        """TRL's GRPOConfig with this recipe's fields; unknown fields are an error, not a
        silently ignored setting."""
        from trl import GRPOConfig

        known = {f.name for f in dataclasses.fields(GRPOConfig)}
        values = {**self.trainer, **overrides}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"recipe: GRPOConfig has no field(s) {', '.join(unknown)} (TRL changes them; see its docs)"
            )
        values.setdefault("report_to", "none")
        return GRPOConfig(output_dir=str(output_dir), **values)
