"""The kinds of queue work stepq runs, each a table and a handler on the one job queue.

The Celery app registers one task per kind, the dispatcher publishes every kind within one
broker bound, and the embedded runner drains them in-process, all from this list.  Adding a
kind (docs/architecture.md, "Adding a kind of queue work") is a table with the
``LeasedJob`` columns, its ``JobTable``, a handler, and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from stepq.models import jobs
from stepq.models.prioritization import PRIORITY_SCORINGS
from stepq.models.search import STEP_SEARCHES
from stepq.models.work import ROLLOUT_WORK
from stepq.workers.jobqueue.runner import Handler, JobKind, Outlet

if TYPE_CHECKING:
    from stepq.workers.labelling.rollouts import WorkerRuntime


def _rollouts() -> Handler:
    from stepq.workers.labelling.rollouts import run_work_items

    def run(rt: WorkerRuntime, ids: list[int]) -> dict[int, str]:
        return {i: outcome.status for i, outcome in run_work_items(rt, ids).items()}

    return run


def _scorings() -> Handler:
    from stepq.workers.priority.scoring import run_scorings

    return run_scorings


def _searches() -> Handler:
    from stepq.workers.search.runner import run_searches

    return run_searches


ROLLOUTS = JobKind(ROLLOUT_WORK, "stepq.annotate_trajectory", _rollouts)
"""A trajectory's missing rollouts; several to a message (one engine call serves them)."""
SEARCHES = JobKind(STEP_SEARCHES, "stepq.step_search", _searches)
"""One problem's step search, one to a message (a search is a long task)."""

SCORINGS = JobKind(PRIORITY_SCORINGS, "stepq.priority_scoring", _scorings)
"""A range of a set's waiting trajectories scored by a priority round's judge."""

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
        per = rollouts_per_message if kind is ROLLOUTS else kind.per_message
        out.append(Outlet(kind, publisher(kind, per), per))
    return out


def retry_failed(session: Session, set_id: int | None = None) -> dict[str, int]:
    """Failed jobs of every kind (of one set, or all) get a fresh round of attempts; returns
    how many per kind."""
    return {kind.table.name: jobs.retry_failed(session, kind.table, set_id) for kind in KINDS}
