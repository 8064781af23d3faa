"""Segmentation: joining the chunks gives the text back exactly, for every method."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepq.workers.data.segmentation import (
    SegmentationError,
    join_steps,
    segment,
    split_blank_lines,
    split_chunk_tags,
    split_step_markers,
    strip_chunk_tags,
)


def test_chunk_tags_keep_tags_and_surroundings() -> None:
    text = "Let me think.\n<chunk>First, x = 2.</chunk>\n<chunk>Then y = 3.</chunk>\nDone."
    chunks = split_chunk_tags(text)
    assert chunks == ["Let me think.\n<chunk>First, x = 2.</chunk>\n", "<chunk>Then y = 3.</chunk>\nDone."]
    assert strip_chunk_tags("".join(chunks)) == "Let me think.\nFirst, x = 2.\nThen y = 3.\nDone."


def test_step_markers() -> None:
    text = "Plan.\nStep 1: add.\nStep 2: multiply.\n**Step 3:** done \\boxed{4}"
    assert split_step_markers(text) == ["Plan.\nStep 1: add.\n", "Step 2: multiply.\n", "**Step 3:** done \\boxed{4}"]


def test_step_markers_only_at_line_start() -> None:
    assert split_step_markers("Step 1: see Step 2: later\nStep 2: x") == ["Step 1: see Step 2: later\n", "Step 2: x"]


def test_blank_lines_merge_short_paragraphs_up_to_the_maximum() -> None:
    text = "a\n\nb\n\n" + "c" * 50 + "\n\nd"
    assert split_blank_lines(text, max_chars=10) == ["a\n\nb\n\n", "c" * 50 + "\n\n", "d"]
    assert split_blank_lines(text, max_chars=1000) == [text]
    assert split_blank_lines("one paragraph") == ["one paragraph"]


def test_blank_lines_with_whitespace_only_lines_and_crlf() -> None:
    text = "first\r\n  \r\nsecond\n\t\nthird"
    chunks = split_blank_lines(text, max_chars=1)
    assert "".join(chunks) == text and len(chunks) == 3


def test_given_steps() -> None:
    assert join_steps(["a", "b", "c"]) == ["a\n\n", "b\n\n", "c"]
    with pytest.raises(SegmentationError):
        join_steps([])


def test_auto_prefers_tags_then_markers_then_blank_lines() -> None:
    assert segment("<chunk>a</chunk><chunk>b</chunk>").method == "chunk-tags"
    assert segment("Step 1: a\nStep 2: b").method == "step-markers"
    assert segment("a\n\nb").method == "blank-lines"


def test_errors() -> None:
    with pytest.raises(SegmentationError):
        segment("")
    with pytest.raises(SegmentationError):
        segment("text", "nonsense")
    with pytest.raises(SegmentationError):
        split_chunk_tags("no tags")
    with pytest.raises(SegmentationError):
        split_step_markers("no markers")


texts = st.text(alphabet=st.sampled_from(list("ab \n\t\rStep1:<>chunk/")), max_size=200)


@given(texts, st.sampled_from(["auto", "blank-lines"]), st.integers(min_value=1, max_value=300))
def test_joining_chunks_reproduces_the_text(text: str, method: str, max_chars: int) -> None:
    if not text:
        return
    seg = segment(text, method)
    assert seg.text == text
    assert all(seg.chunks)
    chunks = split_blank_lines(text, max_chars)
    assert "".join(chunks) == text and all(chunks)


@given(st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=10))
def test_given_steps_join_back(steps: list[str]) -> None:
    chunks = join_steps(steps)
    assert len(chunks) == len(steps)
    assert "".join(chunks) == "\n\n".join(steps)
