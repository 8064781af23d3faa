"""Segmentation by a model: ask it to insert ``<chunk>`` tags, accept only exact results.

The model is given the paper's rules (one purpose per chunk, logical cohesion, a new chunk
at each transition).  Its answer is accepted only if removing the tags gives back the
original text exactly; the chunk boundaries are then cut from the original text, so the
chunks still join to it byte for byte.  Otherwise the heuristic splitter is used and the
fallback is recorded in the method name.
"""

from __future__ import annotations

from collections.abc import Sequence

from stepq.workers.backends import GenerationBackend, GenerationRequest, SamplingParams
from stepq.workers.data.segmentation import CHUNK_CLOSE, CHUNK_OPEN, Segmentation, cut_at, segment, strip_chunk_tags
from stepq.workers.seeds import derive_seed

SEGMENT_PROMPT = (
    "Split the solution below into reasoning chunks by inserting <chunk> and </chunk> tags. "
    "Rules: each chunk has one purpose (a calculation, a case, a check, a conclusion); keep "
    "logically connected sentences together; start a new chunk at every transition. Copy the "
    "text exactly: do not add, remove or change any character other than the tags.\n\n"
    "Solution:\n{text}\n\nTagged solution:\n"
)
FALLBACK = "blank-lines"


def boundaries(tagged: str, original: str) -> list[int] | None:
    """Offsets in ``original`` where tagged chunks start, or None if the text was altered."""
    if strip_chunk_tags(tagged) != original:
        return None
    starts, pos, i = [], 0, 0
    while i < len(tagged):
        if tagged.startswith(CHUNK_OPEN, i):
            starts.append(pos)
            i += len(CHUNK_OPEN)
        elif tagged.startswith(CHUNK_CLOSE, i):
            i += len(CHUNK_CLOSE)
        else:
            pos += 1
            i += 1
    return starts


def segment_with_model(
    texts: Sequence[str], backend: GenerationBackend, *, seed: int = 0, max_tokens: int = 8192
) -> list[Segmentation]:
    """One greedy-ish request per text; each result is ``llm`` or ``llm-fallback:blank-lines``."""
    requests = [
        GenerationRequest(SEGMENT_PROMPT.replace("{text}", t), (derive_seed("segment", seed, t),)) for t in texts
    ]
    outputs = backend.generate(requests, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    out = []
    for text, completions in zip(texts, outputs, strict=True):
        tagged = completions[0].text if completions else ""
        starts = boundaries(tagged, text) or boundaries(tagged.strip("\n"), text)
        if starts:
            out.append(Segmentation("llm", tuple(cut_at(text, starts))))
        else:
            fallback = segment(text, FALLBACK)
            out.append(Segmentation(f"llm-fallback:{FALLBACK}", fallback.chunks))
    return out
