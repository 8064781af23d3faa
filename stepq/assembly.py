"""A process that runs queue work, and the fleet's dispatcher, put together the one way every
front end uses: the worker and dispatch commands, the embedded runner (``stepq run``), ``stepq
search run``, the benchmarks and the tests.  The settings give its options and its kinds'
retry policy; the trainer gives the judge factory priority scoring asks (workers never import
the trainer: docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepq.models import Database
from stepq.settings import Settings
from stepq.trainer.evaluation.scoring_judges import ScoringJudges
from stepq.workers.backends import GenerationBackend
from stepq.workers.engines import Engines
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
    openai_api_key: str = "",
) -> WorkerRuntime:
    """A worker runtime: ``backend`` replaces each set's own (a worker's engine, closed with the
    runtime when it ``owns_backend``); the judge factory defaults to the trainer's."""
    engines = Engines(
        Grader() if grade_timeout_s is None else Grader(timeout_s=grade_timeout_s),
        override=backend,
        owns_override=owns_backend,
        judge_factory=judge_factory if judge_factory is not None else ScoringJudges(db),
        openai_api_key=openai_api_key,
    )
    return WorkerRuntime(db, options or WorkerOptions(), engines)


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
        openai_api_key=settings.openai_api_key,
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


@dataclass(frozen=True)
class QueueWorkerSpec:
    """A ``stepq worker`` process as its command's options give it."""

    name: str | None = None
    pool: str = "solo"
    concurrency: int = 1
    loglevel: str | None = None
    backend: str | None = None
    """The worker's own engine for every set (None: each set's policy)."""
    backend_config: dict[str, Any] = field(default_factory=dict)
    """The engine's config as the options give it (checked before the worker starts)."""
    engine_defaults: dict[str, Any] = field(default_factory=dict)
    """Settings the engine is built with unless its config names them (tensor parallelism,
    GPU memory share)."""


def run_queue_worker(settings: Settings, spec: QueueWorkerSpec) -> None:
    """Check what a worker needs before it takes work (the database, its engine's config and
    packages, the grader, the broker), then run Celery's worker until it stops.  The runtime
    is built in the process that runs tasks (each prefork child after its fork), once: the
    engine stays warm for every task that process runs."""
    from stepq.workers.backends import check_config, check_installed, make_backend
    from stepq.workers.celery_app import create_app, run_worker, wait_for_broker

    checked = Database(settings.database_url, guards=settings.session_guards())
    checked.check()
    checked.engine.dispose()
    if spec.backend:
        check_config(spec.backend, spec.backend_config)
        check_installed(spec.backend)  # before the broker: a worker that cannot generate takes no work
    self_tested_grader(settings)
    wait_for_broker(settings.broker_url, settings.broker_wait_s)

    def runtime() -> WorkerRuntime:
        # a connection for each thread that runs tasks, the write-behind thread and the heartbeat
        threads = (spec.concurrency if spec.pool == "threads" else 1) + 2
        database = Database(
            settings.database_url,
            pool_size=threads,
            synchronous_commit=settings.synchronous_commit,
            guards=settings.session_guards(),
        )
        config = {**spec.engine_defaults, **spec.backend_config}
        engine = make_backend(spec.backend, config) if spec.backend else None
        return configured_runtime(settings, database, spec.name, queue_worker=True, backend=engine)

    app = create_app(
        settings.celery_options(), runtime, forking_pool=spec.pool == "prefork", kinds=settings.job_kinds()
    )
    argv = [
        "worker",
        f"--pool={spec.pool}",
        f"--concurrency={spec.concurrency}",
        f"--queues={settings.queue}",
        f"--loglevel={(spec.loglevel or settings.log_level).upper()}",
        "--without-gossip",
        "--without-mingle",
    ]
    if spec.name:
        argv.append(f"--hostname={spec.name}@%h")
    run_worker(app, argv)


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
