"""What the adaptive budget's samples cost in tokens, and where it looks next for a wrong
trajectory's first dead prefix (pure).

Between the last prefix known alive and the first known dead, one prefix is probed at a
time until they meet.  Binary search by position would minimise the probes; what a GPU
pays for is tokens, and a rollout from a late prefix writes less than one from an early
prefix, so the search here minimises the chunks its rollouts are expected to write.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache


def answer_surplus(chunk_sizes: Sequence[int]) -> float:
    """How many chunks' worth more than its steps a rollout writes at the end: the last
    chunk carries the final answer, so it is usually longer than the others (a tiny model's
    one-digit steps: 22 characters, the last with its answer 52).  Read from the
    trajectory's own chunks, in halves of a chunk, 0 to 4; 0 when their sizes are unknown."""
    if len(chunk_sizes) < 2:
        return 0.0
    steps = sum(chunk_sizes[:-1]) / (len(chunk_sizes) - 1)
    if steps <= 0:
        return 0.0
    return min(4.0, max(0.0, round(2 * (chunk_sizes[-1] / steps - 1)) / 2))


def search_point(lo: int, hi: int, n: int, surplus: float = 0.0) -> int:
    """The prefix to probe next when ``lo`` is alive, ``hi`` dead and those between unknown.

    A rollout from prefix k writes about the trajectory's own rest: its n - k chunks, the
    last of them ``surplus`` chunks longer (``answer_surplus``), so late prefixes are cheap.
    Every probe is priced at the same number of samples whatever it finds: a dead proof
    costs the full budget, and so does nearly an alive prefix of small Q, and the search has
    no estimate of Q before it samples.  With the first dead prefix equally likely anywhere
    in (lo, hi], this is the first probe of the search that minimises the expected chunks
    generated (an exact recursion over sub-ranges, cached per shape), where the middle would
    minimise the probes: it leans towards the cheap end, less so the longer the answer.
    """
    return lo + _plan(hi - lo, n - lo, surplus)[1]


@lru_cache(maxsize=8192)
def _plan(width: int, left: int, surplus: float) -> tuple[float, int]:
    """(expected chunks per sample, first probe's offset) for a search over ``width``
    candidates after an alive prefix from which a rollout writes ``left`` chunks."""
    if width <= 1:
        return 0.0, 0
    best: tuple[float, int] = (math.inf, 1)
    for j in range(1, width):
        alive = (width - j) / width * _plan(width - j, left - j, surplus)[0]
        dead = j / width * _plan(j, left, surplus)[0]
        cost = (left - j + surplus) + alive + dead
        if cost < best[0]:
            best = (cost, j)
    return best


def stop_scale(i: int, n: int, surplus: float = 0.0) -> float:
    """How dear chunk i's samples are against the trajectory's average prefix: the mean
    rollout length of the prefixes on its two sides that can be sampled (i - 1, and i unless
    it is the complete solution) over the mean of all n prefixes, a rollout from prefix k
    writing n - k chunks plus the answer's ``surplus``.  The value-of-information stop asks
    for that many times ``settle``: the same gain per token everywhere."""
    sides = [n - k + surplus for k in (i - 1, i) if k < n]
    return (sum(sides) / len(sides)) / ((n + 1) / 2 + surplus)
