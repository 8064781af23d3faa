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
from typing import TYPE_CHECKING

from stepq.models.errors import ConfigError, StepqError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

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


FALLBACK_PREFIX = "llm-fallback:"


def reproducing_splitter(samples: Sequence[Sequence[str]]) -> str | None:
    """The splitter that cuts every sample's text into exactly its recorded chunks, or None."""
    for name in ("chunk-tags", "step-markers", "blank-lines"):
        try:
            if samples and all(list(SPLITTERS[name]("".join(chunks))) == list(chunks) for chunks in samples):
                return name
        except SegmentationError:
            continue
    return None


def cutting_method(recorded: str | None, samples: Sequence[Sequence[str]], set_name: str) -> str | None:
    """How new text of a set's policy (a search's candidates, chunk-reset's chunks) is cut into
    the chunks its trajectories were cut into: the recorded method where it has a splitter (an
    LLM segmentation that fell back names its splitter); for an LLM's or the data's own steps,
    the splitter that reproduces the recorded chunks of every sampled trajectory.  None of them
    does: refused, never a silent cut at the first blank line (a "Step n" policy whose chunks an
    LLM drew got whole-solution candidates that way)."""
    if recorded is None or recorded == "auto" or recorded in SPLITTERS:
        return recorded
    if recorded.startswith(FALLBACK_PREFIX) and recorded[len(FALLBACK_PREFIX) :] in SPLITTERS:
        return recorded[len(FALLBACK_PREFIX) :]
    found = reproducing_splitter(samples)
    if found is None:
        raise ConfigError(
            f"set '{set_name}': its trajectories were cut by '{recorded}', and no splitter (chunk-tags, "
            f"step-markers, blank-lines) gives back their chunks ({len(samples)} checked), so new text of its "
            f"policy cannot be cut the same way; segment the set with a splitter first (stepq segment --set "
            f"{set_name} --method step-markers, or the one that fits)"
        )
    return found


def set_cutting_method(session: Session, set_id: int, set_name: str) -> str | None:
    """``cutting_method`` for the method most of a set's policy trajectories were cut with."""
    from stepq.models import queries

    recorded = queries.set_segmentation(session, set_id)
    needs_samples = recorded is not None and recorded != "auto" and recorded not in SPLITTERS
    samples = queries.segmented_samples(session, set_id, recorded) if needs_samples and recorded else []
    return cutting_method(recorded, samples, set_name)


def next_chunk(text: str, method: str | None) -> tuple[str, bool]:
    """The first chunk of a continuation as ``method`` segments text (a set's own method:
    the chunks its judge was trained on, the steps a search takes one at a time), and whether
    it is the last one.  ``auto`` tries the methods in ``segment``'s order; None cuts at the
    first blank line.  A method with no splitter (given steps, an LLM segmenter) is refused:
    ``cutting_method`` resolves it to the splitter that reproduces it, or says why it cannot."""
    if method == "auto" and text:
        method = segment(text, "auto").method
    if method is not None and method not in SPLITTERS:
        raise SegmentationError(f"no splitter for '{method}': resolve it with cutting_method first")
    if method is None or not text:
        return first_chunk(text, "\n\n")
    try:
        chunks = SPLITTERS[method](text)
    except SegmentationError:  # no tag or marker in what the policy wrote: all of it is one chunk
        return text, True
    first = chunks[0]
    return first, len(chunks) == 1 or "\\boxed" in first
