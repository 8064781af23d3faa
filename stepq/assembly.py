"""A process that runs queue work, and the fleet's dispatcher, put together the one way every
front end uses: the worker and dispatch commands, the embedded runner (``stepq run``), ``stepq
search run``, the benchmarks and the tests.  The settings give its options and its kinds'
retry policy; the trainer gives the judge factory priority scoring asks (workers never import
the trainer: docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from stepq.models import Database
from stepq.settings import Settings
from stepq.trainer.evaluation.scoring_judges import ScoringJudges
from stepq.workers.backends import GenerationBackend
from stepq.workers.grading.grader import Grader
from stepq.workers.jobqueue.dispatcher import Dispatcher
from stepq.workers.jobqueue.job_kind import JobKind
from stepq.workers.jobqueue.runtime import WorkerOptions, WorkerRuntime

if TYPE_CHECKING:
    from stepq.models.wakeup import WorkListener


def worker_runtime(
    db: Database,
    options: WorkerOptions | None = None,
    *,
    grade_timeout_s: int | None = None,
    backend: GenerationBackend | None = None,
    owns_backend: bool = False,
    judge_factory: Callable[[int, Any], Any] | None = None,
) -> WorkerRuntime:
    """A worker runtime: ``backend`` replaces each set's own (a worker's engine, closed with the
    runtime when it ``owns_backend``); the judge factory defaults to the trainer's."""
    return WorkerRuntime(
        db,
        options or WorkerOptions(),
        Grader() if grade_timeout_s is None else Grader(timeout_s=grade_timeout_s),
        backend_override=backend,
        owns_override=owns_backend,
        judge_factory=judge_factory if judge_factory is not None else ScoringJudges(db),
    )


def configured_runtime(
    settings: Settings,
    db: Database,
    name: str | None = None,
    *,
    queue_worker: bool = False,
    backend: GenerationBackend | None = None,
) -> WorkerRuntime:
    """The runtime a front end runs, from the settings (``queue_worker``: a ``stepq worker``
    process, where write-behind applies)."""
    return worker_runtime(
        db,
        settings.worker_options(name, queue_worker=queue_worker),
        grade_timeout_s=settings.grade_timeout_s,
        backend=backend,
        owns_backend=backend is not None,
    )


def queue_dispatcher(settings: Settings, db: Database) -> tuple[Dispatcher, WorkListener | None]:
    """The fleet's dispatcher: every kind under the settings' retry policy, published through
    the broker within its bound, the broker's contents read to find lost messages, woken by
    PostgreSQL's notices of new work (the listener: close it when done; None on SQLite)."""
    from stepq.models.wakeup import WorkListener
    from stepq.workers.celery_app import create_app, outlets
    from stepq.workers.jobqueue.broker_contents import redis_jobs_in_broker, redis_queue_depth

    app = create_app(settings.celery_options())
    listener = WorkListener(db.engine) if db.engine.dialect.name == "postgresql" else None
    dispatcher = Dispatcher(
        db,
        outlets(app, settings.items_per_task, settings.job_kinds()),
        options=settings.dispatch_options(),
        queue_depth=redis_queue_depth(settings.broker_url, settings.queue),
        in_broker=redis_jobs_in_broker(settings.broker_url, settings.queue),
        wakeup=listener.wait if listener else None,
    )
    return dispatcher, listener


def self_tested_grader(settings: Settings) -> None:
    """Refuse to start (exit 2) rather than grade every hard answer as wrong: the grader's
    self-test, with room for a cold sympy import."""
    grader = Grader(timeout_s=max(settings.grade_timeout_s, 10))
    try:
        grader.self_test()
    finally:
        grader.close()


def kinds_of(settings: Settings, only: Sequence[JobKind] | None = None) -> tuple[JobKind, ...]:
    """The kinds a process runs (all, or ``only`` these), under the settings' retry policy."""
    wanted = {kind.task_name for kind in only} if only is not None else None
    return tuple(k for k in settings.job_kinds() if wanted is None or k.task_name in wanted)
