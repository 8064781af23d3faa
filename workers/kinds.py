"""The kinds of queue work stepq runs: the registry.

Each kind is defined beside its handler (``JobKind``: its table, Celery task, handler, retry
policy and the dispatcher's planning hook); this list is what the Celery app registers, the
dispatcher publishes within one broker bound, and the embedded runner drains.  Adding a kind
(docs/architecture.md, "Adding a kind of queue work") is a table with the ``LeasedJob``
columns, its ``JobTable``, a handler with its ``JobKind``, and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy.orm import Session

from stepq.models import jobs
from stepq.workers.jobqueue.job_kind import JobKind, Outlet
from stepq.workers.labelling.rollout_handler import ROLLOUTS
from stepq.workers.priority.scoring_handler import SCORINGS
from stepq.workers.search.search_handler import SEARCHES

KINDS: tuple[JobKind, ...] = (ROLLOUTS, SEARCHES, SCORINGS)


def outlets(
    publisher: Callable[[JobKind, int], Callable[[Sequence[int]], None]],
    rollouts_per_message: int,
    kinds: Sequence[JobKind] = KINDS,
) -> list[Outlet]:
    """The dispatcher's outlets: ``publisher(kind, per_message)`` for each kind, rollouts
    ``rollouts_per_message`` to a message (the settings' ``items_per_task``), every other kind
    its own ``per_message``."""
    out = []
    for kind in kinds:
        per = rollouts_per_message if kind.table is ROLLOUTS.table else kind.per_message
        out.append(Outlet(kind, publisher(kind, per), per))
    return out


def retry_failed(session: Session, set_id: int | None = None, kinds: Sequence[JobKind] = KINDS) -> dict[str, int]:
    """Failed jobs of every kind (of one set, or all) get a fresh round of attempts; returns
    how many per kind."""
    return {kind.table.name: jobs.retry_failed(session, kind.table, set_id) for kind in kinds}
