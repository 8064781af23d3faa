"""Rewards for judge training: a registry of pure functions chosen by name in a recipe.

Each has TRL's reward signature: ``fn(completions, **columns) -> list[float]``; the dataset's
columns (here ``label``) arrive as keyword lists.  A completion is a string, or a list of
chat messages whose last ``content`` is the answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from stepq.models.errors import ConfigError
from stepq.trainer.generative_judge.prompt import parse_verdict

RewardFn = Callable[..., list[float]]
REWARDS: dict[str, RewardFn] = {}

_FORMAT = re.compile(
    r"1\.\s*Analysis:.+2\.\s*Final Judgment:\s*\\boxed\s*\{\s*(positive|negative)\s*\}\s*$", re.IGNORECASE | re.DOTALL
)


def reward(name: str) -> Callable[[RewardFn], RewardFn]:
    def register(fn: RewardFn) -> RewardFn:
        REWARDS[name] = fn
        fn.__name__ = name.replace("-", "_")
        return fn

    return register


def completion_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


_LABEL_SPELLINGS = {
    **dict.fromkeys(("positive", "true", "1", "yes", "correct", "+"), True),
    **dict.fromkeys(("negative", "false", "0", "no", "incorrect", "-"), False),
}


def label_value(label: Any) -> bool:
    """Labels arrive as "Positive"/"Negative" (the export), booleans, 0/1, or the spellings
    other data sets use ("True", "yes", "correct"); anything else is an error naming the value,
    never a silent Negative (which would invert a data set's labels without a word)."""
    if hasattr(label, "item") and not isinstance(label, str):  # a numpy or torch scalar
        label = label.item()
    if isinstance(label, bool):
        return label
    if isinstance(label, int | float) and label in (0, 1):
        return bool(label)
    if isinstance(label, str) and label.strip().lower() in _LABEL_SPELLINGS:
        return _LABEL_SPELLINGS[label.strip().lower()]
    raise ConfigError(f"step label {label!r} is not one of: Positive/Negative, True/False, 1/0, yes/no")


@reward("verdict-match")
def verdict_match(completions: Sequence[Any], label: Sequence[Any], **_: Any) -> list[float]:
    """StepWiser's reward: 1 when the parsed verdict equals the label, else 0 (no verdict = 0)."""
    out = []
    for completion, lab in zip(completions, label, strict=True):
        verdict = parse_verdict(completion_text(completion))
        out.append(1.0 if verdict is not None and verdict == label_value(lab) else 0.0)
    return out


@reward("format")
def format_reward(completions: Sequence[Any], **_: Any) -> list[float]:
    """1 when the answer is "1. Analysis: ... 2. Final Judgment: \\boxed{...}" and ends there."""
    return [1.0 if _FORMAT.search(completion_text(c).strip()) else 0.0 for c in completions]


def get_rewards(names: Sequence[str]) -> list[RewardFn]:
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        raise ConfigError(f"unknown reward {', '.join(unknown)} (one of: {', '.join(sorted(REWARDS))})")
    return [REWARDS[n] for n in names]
