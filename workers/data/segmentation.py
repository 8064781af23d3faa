"""Split a solution into chunks so that joining the chunks gives the text back exactly.

Every splitter keeps separators inside the chunks (a chunk ends where the next begins),
because a rollout continues from ``text[:end of chunk k]`` byte for byte: dropping or
normalising a single newline would change the context the policy is asked to continue.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stepq.models.errors import StepqError

CHUNK_OPEN = "<chunk>"
CHUNK_CLOSE = "</chunk>"
_STEP_MARKER = re.compile(r"(?m)^[ \t]*(?:\*\*)?Step\s+\d+\s*(?:\*\*)?\s*[:.]")
_BLANK_LINES = re.compile(r"\n[ \t\r]*\n\s*")


class SegmentationError(StepqError):
    """The text does not fit the requested method (e.g. no ``<chunk>`` tags)."""


@dataclass(frozen=True)
class Segmentation:
    method: str
    chunks: tuple[str, ...]

    @property
    def text(self) -> str:
        return "".join(self.chunks)


def cut_at(text: str, starts: Sequence[int], *, preamble_joins_first: bool = False) -> list[str]:
    """Cut ``text`` at ``starts``; optionally text before the first start joins the first chunk."""
    bounds = sorted({s for s in starts if 0 < s < len(text)})
    if preamble_joins_first and starts and min(starts) > 0:
        bounds = bounds[1:]
    edges = [0, *bounds, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(edges) if b > a]


def split_chunk_tags(text: str) -> list[str]:
    """``<chunk>…</chunk>`` tags written by a self-segmenting policy; tags stay in the text."""
    starts = [m.start() for m in re.finditer(re.escape(CHUNK_OPEN), text)]
    if not starts:
        raise SegmentationError("no <chunk> tags in the text")
    return cut_at(text, starts, preamble_joins_first=True)


def split_step_markers(text: str) -> list[str]:
    """``Step n:`` markers at the start of a line; a preamble joins the first step."""
    starts = [m.start() for m in _STEP_MARKER.finditer(text)]
    if not starts:
        raise SegmentationError("no 'Step n:' markers in the text")
    return cut_at(text, starts, preamble_joins_first=True)


def split_blank_lines(text: str, max_chars: int = 600) -> list[str]:
    """Paragraphs, with consecutive short paragraphs merged while they fit in ``max_chars``.

    Merging keeps one-line paragraphs ("So:", a lone equation) from becoming chunks of
    their own, which would spend a whole prefix of rollouts on no reasoning at all.
    """
    pieces = cut_at(text, [m.end() for m in _BLANK_LINES.finditer(text)])
    merged: list[str] = []
    for piece in pieces:
        if merged and len(merged[-1]) + len(piece) <= max_chars:
            merged[-1] += piece
        else:
            merged.append(piece)
    return merged or [text]


def join_steps(steps: Sequence[str], separator: str = "\n\n") -> list[str]:
    """Given step lists (ProcessBench): each step is a chunk, the separator ends all but the last."""
    if not steps:
        raise SegmentationError("empty step list")
    return [s + separator for s in steps[:-1]] + [steps[-1]]


SPLITTERS: dict[str, Callable[[str], list[str]]] = {
    "chunk-tags": split_chunk_tags,
    "step-markers": split_step_markers,
    "blank-lines": split_blank_lines,
}


def segment(text: str, method: str = "auto") -> Segmentation:
    """Segment with ``method``; ``auto`` prefers tags, then step markers, then blank lines."""
    if not text:
        raise SegmentationError("empty text")
    if method == "auto":
        for name in ("chunk-tags", "step-markers", "blank-lines"):
            try:
                return segment(text, name)
            except SegmentationError:
                continue
    if method not in SPLITTERS:
        raise SegmentationError(f"unknown segmentation method '{method}' (one of: auto, {', '.join(SPLITTERS)})")
    chunks = SPLITTERS[method](text)
    assert "".join(chunks) == text
    return Segmentation(method, tuple(chunks))


def strip_chunk_tags(text: str) -> str:
    """The text as a reader sees it, without the segmentation tags."""
    return text.replace(CHUNK_OPEN, "").replace(CHUNK_CLOSE, "")


def first_chunk(text: str, delimiter: str) -> tuple[str, bool]:
    """The first chunk of a continuation (through its delimiter) and whether it is the last
    one (no more text after it, or it holds the final answer)."""
    cut = text.find(delimiter)
    if cut < 0:
        return text, True
    chunk, rest = text[: cut + len(delimiter)], text[cut + len(delimiter) :]
    return chunk, not rest.strip() or "\\boxed" in chunk


def next_chunk(text: str, method: str | None) -> tuple[str, bool]:
    """The first chunk of a continuation as ``method`` segments text (a set's own method:
    the chunks its judge was trained on, the steps a search takes one at a time), and whether
    it is the last one.  ``auto`` tries the methods in ``segment``'s order.  Methods with no
    splitter here (given steps, an LLM segmenter) and None cut at the first blank line."""
    if method == "auto" and text:
        method = segment(text, "auto").method
    if method not in SPLITTERS or not text:
        return first_chunk(text, "\n\n")
    try:
        chunks = SPLITTERS[method](text)
    except SegmentationError:  # no tag or marker in what the policy wrote: all of it is one chunk
        return text, True
    first = chunks[0]
    return first, len(chunks) == 1 or "\\boxed" in first
