"""Policy prompt templates: how the policy is asked to solve a problem.

The rendered prompt is stored on every trajectory exactly as the policy saw it (with the
model's chat template applied once, when the backend has one); rollouts continue from it
as a raw completion.  ``{question}`` is the only placeholder.
"""

from __future__ import annotations

from pathlib import Path

from stepq.models.errors import ConfigError
from stepq.workers.backends.synthetic_policy import PROMPT_TEMPLATE as SYNTHETIC_TEMPLATE

# The StepWiser self-segmentation prompt: the policy marks its own reasoning chunks.
CHUNK_TEMPLATE = (
    "Solve the following math problem. Write your reasoning as a sequence of chunks, each "
    "wrapped in <chunk> and </chunk>. A chunk has one purpose (a calculation, a case, a "
    "check, a conclusion); keep logically connected steps in one chunk and start a new chunk "
    "at every transition. Put the final answer in \\boxed{{}} inside the last chunk.\n\n"
    "Problem: {question}"
)

STEP_TEMPLATE = (
    "Solve the following math problem step by step. Begin each step on a new line with "
    "'Step n:' (Step 1:, Step 2:, ...), and give the final answer as \\boxed{{}}.\n\n"
    "Problem: {question}"
)

TEMPLATES = {"chunk": CHUNK_TEMPLATE, "step": STEP_TEMPLATE, "synthetic": SYNTHETIC_TEMPLATE}


def load_template(name: str | None = None, path: Path | None = None) -> str:
    """A named template, or one read from a file; it must contain ``{question}``."""
    if path is not None:
        try:
            template = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read template {path}: {exc.strerror}") from None
    elif name in TEMPLATES:
        template = TEMPLATES[name]
    else:
        raise ConfigError(f"unknown template '{name}' (one of: {', '.join(TEMPLATES)}, or --template-file)")
    if "{question}" not in template:
        raise ConfigError("a policy template needs a {question} placeholder")
    return template


def render(template: str, question: str) -> str:
    return (
        template.replace("{{", "\x00")
        .replace("}}", "\x01")
        .replace("{question}", question)
        .replace("\x00", "{")
        .replace("\x01", "}")
    )
