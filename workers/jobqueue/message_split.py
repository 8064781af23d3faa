"""How the dispatcher groups jobs into broker messages, and how it counts the small ones.

A message of several trajectories is one engine call (better batching), but it is also the
unit a worker takes: when a set drains, the last full messages leave some workers idle while
one finishes.  Measured through the queue (``bench_queue``, a 60-problem set), splitting the
tail is worth 4.5-6 points of each worker's throughput.  So near the end of the backlog the dispatcher
switches to guided self-scheduling (Polychronopoulos and Kuck, 1987): each message takes a
share of what is left, ``ceil(left / (share * workers))`` jobs, never more than a full
message, so the last ones are single jobs and the workers finish together.  Only the tail is
split: while the backlog is long every message is full and batches as before.

Small messages would make the broker's bound (counted in messages, estimated from queued
jobs as ``ceil(queued / per_message)``) undercount, so the dispatcher remembers the small
messages it published (:class:`SmallMessages`) and counts each as one message while any of
its jobs is still queued.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

TAIL_SHARE = 2
"""Messages per live worker that the last of the backlog is spread over (GSS uses 1; 2 keeps
the last messages smaller still, and costs a few more engine calls at the very end)."""


def tail_threshold(per_message: int, workers: int, share: int = TAIL_SHARE) -> int:
    """Fewer pending jobs than this, and the next messages are smaller than full; 0 when
    splitting cannot help (one worker, or one job to a message)."""
    if per_message <= 1 or workers <= 1:
        return 0
    return share * workers * per_message


def split_messages(
    ids: Sequence[int], per_message: int, workers: int, *, complete: bool, share: int = TAIL_SHARE
) -> list[list[int]]:
    """Group ``ids`` (in publishing order) into messages.  ``complete``: ``ids`` is every job
    pending now, so its length is what is left of the backlog; otherwise more wait and every
    message is full."""
    per = max(1, per_message)
    if not complete or len(ids) >= tail_threshold(per, workers, share):
        return [list(ids[i : i + per]) for i in range(0, len(ids), per)]
    messages: list[list[int]] = []
    start = 0
    while start < len(ids):
        left = len(ids) - start
        size = min(per, max(1, -(-left // (share * workers))))
        messages.append(list(ids[start : start + size]))
        start += size
    return messages


class SmallMessages:
    """The messages of fewer than ``per_message`` jobs this dispatcher published, so the bound
    counts each as a message while one of its jobs is queued.  In memory: a restarted
    dispatcher counts them as ``ceil(queued / per_message)``, and the tail is short."""

    def __init__(self) -> None:
        self._messages: dict[str, list[frozenset[int]]] = {}

    def add(self, table: str, messages: Iterable[Sequence[int]], per_message: int) -> None:
        small = [frozenset(m) for m in messages if len(m) < per_message]
        if small:
            self._messages.setdefault(table, []).extend(small)

    def tracks(self, table: str) -> bool:
        return bool(self._messages.get(table))

    def count(self, table: str, queued: Iterable[int], per_message: int) -> int:
        """Messages that carry the ``queued`` jobs: each remembered small message still
        holding one counts once, the other queued jobs in full messages.  Forgets the small
        messages whose jobs have all been taken."""
        waiting = set(queued)
        live = [m for m in self._messages.get(table, []) if m & waiting]
        self._messages[table] = live
        carried = set().union(*live) if live else set()
        rest = len(waiting - carried)
        return len(live) + -(-rest // max(1, per_message))
