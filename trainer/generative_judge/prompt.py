"""The judge prompt (StepWiser: problem, historical reasoning path, new reasoning chunk) and
the verdict parser.

The template ships as ``templates/stepwiser.txt`` with ``{problem}``, ``{history}`` and
``{chunk}`` placeholders; a recipe may name another file.  The judge answers
"1. Analysis: ... 2. Final Judgment: \\boxed{Positive}" or "\\boxed{Negative}".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "templates"
DEFAULT_TEMPLATE = TEMPLATES / "stepwiser.txt"
NO_HISTORY = "(none: this is the first chunk)"
POSITIVE, NEGATIVE = "Positive", "Negative"

# A verdict box: "\boxed" then a brace group (read with its nesting by ``_boxed_contents``).
_BOXED_OPEN = re.compile(r"\\boxed\s*\{", re.IGNORECASE)
# LaTeX wrappers a model puts around the word: \text{Positive}, \textbf{...}, \mathrm{...}
_WRAPPER = re.compile(r"^\\(?:text|textbf|textit|mathrm|mathbf|mbox|emph)\s*\{(.*)\}$", re.DOTALL)


@dataclass(frozen=True)
class JudgePrompt:
    """A judge prompt template; ``render`` fills it for one chunk."""

    template: str

    @classmethod
    def load(cls, path: str | Path | None = None) -> JudgePrompt:
        text = Path(path or DEFAULT_TEMPLATE).read_text(encoding="utf-8")
        for field in ("{problem}", "{history}", "{chunk}"):
            if field not in text:
                from stepq.models.errors import ConfigError

                raise ConfigError(f"judge template {path} has no {field} placeholder")
        return cls(text)

    def render(self, problem: str, history: Sequence[str], chunk: str) -> str:
        return self.template.format(
            problem=problem.strip(),
            history="\n\n".join(h.strip() for h in history) if history else NO_HISTORY,
            chunk=chunk.strip(),
        )


def render_judge_prompt(problem: str, history: Sequence[str], chunk: str) -> str:
    """The shipped StepWiser prompt for one chunk."""
    return _default().render(problem, history, chunk)


_CACHE: dict[str, JudgePrompt] = {}


def _default() -> JudgePrompt:
    if "default" not in _CACHE:
        _CACHE["default"] = JudgePrompt.load()
    return _CACHE["default"]


def _boxed_contents(text: str) -> list[str]:
    """The contents of every complete ``\\boxed{...}``, nested braces included, in order."""
    out = []
    for match in _BOXED_OPEN.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    out.append(text[start:i])
                    break
    return out


def parse_verdict(text: str) -> bool | None:
    """True for Positive, False for Negative, None when the answer holds no verdict.

    Only the last ``\\boxed{}`` counts (a judge may quote the format in its analysis).  Its
    content, once LaTeX text wrappers (``\\text{Positive}``), white space and trailing
    punctuation are taken off, must be exactly one of the two words, so
    "\\boxed{Positive or Negative}" is no verdict rather than a guess.
    """
    found = _boxed_contents(text)
    if not found:
        return None
    word = found[-1].strip().rstrip(".!;:, ")
    while (inner := _WRAPPER.match(word)) is not None:
        word = inner.group(1).strip().rstrip(".!;:, ")
    word = word.lower()
    if word == "positive":
        return True
    if word == "negative":
        return False
    return None


def verdict_word(positive: bool) -> str:
    return POSITIVE if positive else NEGATIVE
