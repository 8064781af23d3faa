"""How a generative judge was prompted in training, kept beside its weights so that
evaluation asks it the same way (the same template, chat template or raw prompt, and room
for an analysis as long as training allowed).

``stepq train`` writes ``stepq-judge.json`` into the run's output folder and its ``final``
model; ``stepq eval`` finds it next to the model it is given (the model folder or, for a
checkpoint, the run folder above it).  A judge trained elsewhere has none: the command-line
options and the shipped defaults apply.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stepq.models.errors import ConfigError
from stepq.trainer.generative_judge.prompt import DEFAULT_TEMPLATE, JudgePrompt

FILE = "stepq-judge.json"
DEFAULT_MAX_TOKENS = 3072
"""The shipped GRPO recipe's max_completion_length: a judge of unknown origin may write that much."""


@dataclass(frozen=True)
class JudgeSettings:
    template: str
    chat_template: bool = True
    max_tokens: int = DEFAULT_MAX_TOKENS
    source: str = "defaults"
    """Where these came from, for the report: "defaults" or "training run N"."""
    trained_on: tuple[dict[str, Any], ...] = ()
    """The training snapshot's sets (``training_range``): what an evaluation compares its set with."""

    @classmethod
    def defaults(cls) -> JudgeSettings:
        return cls(DEFAULT_TEMPLATE.read_text(encoding="utf-8"))

    @property
    def prompt(self) -> JudgePrompt:
        return JudgePrompt(self.template)

    def as_dict(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "chat_template": self.chat_template,
            "max_tokens": self.max_tokens,
            "source": self.source,
            "trained_on": list(self.trained_on),
        }

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / FILE).write_text(json.dumps(self.as_dict(), indent=2) + "\n", encoding="utf-8")

    def overridden(
        self, template_file: Path | None = None, chat_template: bool | None = None, max_tokens: int | None = None
    ) -> JudgeSettings:
        """These settings with what the user said explicitly on top."""
        out = self
        if template_file is not None:
            out = replace(out, template=JudgePrompt.load(template_file).template)
        if chat_template is not None:
            out = replace(out, chat_template=chat_template)
        if max_tokens is not None:
            out = replace(out, max_tokens=max_tokens)
        return out


def settings_for_training(
    template: JudgePrompt,
    conversational: bool,
    max_completion_length: int,
    trained_on: tuple[dict[str, Any], ...] = (),
) -> JudgeSettings:
    """What a GRPO run prompts its judge with (the recipe's template, kept as read when the
    run started: the file may not exist where the judge is evaluated later), and what it
    learns from.  The run that wrote them stamps its number into ``source``."""
    return JudgeSettings(template.template, conversational, max_completion_length, "training", tuple(trained_on))


def settings_for_model(model: str | Path | None) -> JudgeSettings:
    """The settings a stepq run saved beside ``model`` (or its run folder), else the defaults."""
    if model is None:
        return JudgeSettings.defaults()
    path = Path(model)
    for folder in (path, path.parent):
        saved = folder / FILE
        if saved.is_file():
            try:
                data = json.loads(saved.read_text(encoding="utf-8"))
                return JudgeSettings(
                    str(data["template"]),
                    bool(data["chat_template"]),
                    int(data["max_tokens"]),
                    str(data["source"]),
                    tuple(dict(t) for t in data.get("trained_on", [])),
                )
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{saved}: not a stepq judge settings file ({exc})") from None
    return JudgeSettings.defaults()
