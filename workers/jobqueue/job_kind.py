"""What a kind of queue work is: its table, its Celery task, its handler, its retry policy and
the dispatcher's hooks for it.  The registry of the kinds stepq runs is ``stepq.workers.kinds``;
this module knows none of them, so the queue's machinery never names a feature.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from sqlalchemy.orm import Session

from stepq.models.errors import ConfigError, GenerationError
from stepq.models.jobs import JobTable

if TYPE_CHECKING:
    from stepq.workers.jobqueue.runner import Claimed
    from stepq.workers.jobqueue.runtime import WorkerRuntime


class Handler(Protocol):
    """Does the work of jobs the runner has claimed (``claimed.ids``), and says how each ended:
    ``claimed.finish`` in the transaction that writes its result, ``claimed.fail`` after an
    error of its own, ``claimed.record`` for a lost lease.  Whatever it leaves unsettled when
    it returns (the process is stopping) the runner hands back; whatever it leaves when it
    raises, the runner fails.  It never claims, holds or hands back a job itself."""

    def __call__(self, rt: WorkerRuntime, claimed: Claimed) -> None: ...


@dataclass(frozen=True)
class RetryPolicy:
    """When a failed job is tried again, and when it is given up on: a permanent error at once,
    else after ``max_attempts`` tries, waiting ``backoff_s`` doubled per attempt, at most
    ``max_backoff_s``, in between.  A kind's one policy: the runner's fail path and the
    dispatcher's lease expiry both read it from the kind, so they give up at the same count."""

    max_attempts: int = 5
    backoff_s: float = 5.0
    max_backoff_s: float = 600.0

    def decide(self, attempts: int, permanent: bool) -> tuple[bool, float]:
        give_up = permanent or attempts >= self.max_attempts
        return give_up, min(self.backoff_s * 2 ** max(0, attempts - 1), self.max_backoff_s)


def is_permanent(exc: BaseException) -> bool:
    """A bad setting or a request the engine refuses for good: trying again cannot help."""
    return isinstance(exc, ConfigError) or (isinstance(exc, GenerationError) and exc.permanent)


@dataclass(frozen=True)
class JobKind:
    """One kind of queue work: its table, its Celery task, the code that runs it, and how many
    jobs go in one broker message by default (a message is what the broker bound counts)."""

    table: JobTable
    task_name: str
    handler: Handler
    per_message: int = 1
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    plan: Callable[[Session], int] | None = None
    """The dispatcher's planning hook, each cycle: create this kind's missing jobs (returns how
    many).  None: jobs are made by commands only."""
    held_back: Callable[[Session], set[int]] | None = None
    """Sets whose pending jobs of this kind wait this cycle (their order is being decided)."""


def with_retry(kinds: Sequence[JobKind], policy: RetryPolicy) -> tuple[JobKind, ...]:
    """The kinds under one retry policy (the settings' ``max_attempts`` and backoff)."""
    return tuple(replace(kind, retry=policy) for kind in kinds)


@dataclass(frozen=True)
class Outlet:
    """Where the dispatcher publishes one kind's pending jobs: ``publish(ids)`` sends them as
    messages of ``per_message`` ids each."""

    kind: JobKind
    publish: Callable[[Sequence[int]], None]
    per_message: int = 1


class PartlyPublished(Exception):
    """A publish that failed part-way (the broker full or gone mid-batch): ``sent`` are the job
    ids whose messages did reach the broker, so only the others go back to pending (putting
    them all back published the sent ones twice)."""

    def __init__(self, sent: Sequence[int], cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.sent = list(sent)
