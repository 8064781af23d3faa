"""Where the adaptive budget looks next for a wrong trajectory's first dead prefix (pure).

Between the last prefix known alive and the first known dead, one prefix is probed at a
time until they meet.  Binary search by position would minimise the probes; what a GPU
pays for is tokens, and a rollout from a late prefix writes less than one from an early
prefix, so the search here minimises the chunks its rollouts are expected to write.
"""

from __future__ import annotations

import math
from functools import lru_cache


def search_point(lo: int, hi: int, n: int) -> int:
    """The prefix to probe next when ``lo`` is alive, ``hi`` dead and those between unknown.

    A rollout from prefix k writes the trajectory's remaining n - k chunks, roughly: late
    prefixes are cheap.  Every probe is priced at the same number of samples whatever it
    finds: a dead proof costs the full budget, and so does nearly an alive prefix of small
    Q, and the search has no estimate of Q before it samples.  With the first dead prefix
    equally likely anywhere in (lo, hi], this is the first probe of the search that
    minimises the expected chunks generated (an exact recursion over sub-ranges, cached per
    shape), where the middle would minimise the probes: it leans towards the cheap end.
    """
    return lo + _plan(hi - lo, n - lo)[1]


@lru_cache(maxsize=4096)
def _plan(width: int, left: int) -> tuple[float, int]:
    """(expected chunks per sample, first probe's offset) for a search over ``width``
    candidates after an alive prefix from which a rollout writes ``left`` chunks."""
    if width <= 1:
        return 0.0, 0
    best: tuple[float, int] = (math.inf, 1)
    for j in range(1, width):
        alive = (width - j) / width * _plan(width - j, left - j)[0]
        dead = j / width * _plan(j, left)[0]
        cost = (left - j) + alive + dead
        if cost < best[0]:
            best = (cost, j)
    return best
