"""Training data as first-error judges are trained: each solution only up to its first error.

OmegaPRM and PRM800K label a solution only up to its first wrong step, and a judge that finds
the first wrong step is only ever asked about steps whose history is right.  Under Abs-Q every
chunk after a dead prefix (Q = 0: no rollout from it finishes right) is Negative whatever it
says; those chunks are most of a solution's late ones, so a small judge trained on them learns
where a chunk is instead of what it says (docs/experiments/judge_grpo.md).  Keeping a
trajectory's chunks only while the prefix before them is alive (``q_before > 0``) removes that
cue: the last chunk kept is the first one after which the prefix is dead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import groupby
from typing import TypeVar

T = TypeVar("T")


def until_first_dead(items: Iterable[T], where: Callable[[T], tuple[int, int, float | None]]) -> list[T]:
    """The items whose prefix is alive: per trajectory, in step order, every item before the
    first whose ``q_before`` is 0.  ``where(item)`` gives (trajectory, step index, q_before);
    an unknown ``q_before`` (None: not sampled) counts as alive.  The items keep their order."""
    given = list(items)
    keep: set[int] = set()
    in_steps = sorted(range(len(given)), key=lambda i: where(given[i])[:2])
    for _, positions in groupby(in_steps, key=lambda i: where(given[i])[0]):
        for i in positions:
            q_before = where(given[i])[2]
            if q_before is not None and q_before <= 0:
                break
            keep.add(i)
    return [given[i] for i in sorted(keep)]
