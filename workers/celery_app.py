"""The Celery application for long GPU tasks, built from explicit options (no globals).

Choices, each for a reason:
- JSON only, pickle refused: messages cross machines and must not execute code.
- ``acks_late`` + prefetch 1: a task is acknowledged after it ran, and a worker holds at
  most one message it has not started, so a dead worker strands at most one hint.
- a Redis visibility timeout longer than the longest task: Redis would otherwise
  redeliver a long task to a second worker while the first still runs it.  Redelivery
  after a crash is not needed anyway: the dispatcher reschedules expired database leases.
- a full Redis (writes refused at ``maxmemory``) is ridden out as a lost connection
  (``full_broker``): Celery's consumer would otherwise end on the refusal.
- messages go to the queue through the default exchange, so they still route after the
  broker lost its state (a flushed Redis forgets Celery's exchange bindings).
- the per-process runtime (database pool, grader, engine, heartbeat) is built in the
  process that runs tasks: for a prefork pool in each child after the fork, never in the
  parent, so no engine, CUDA context or connection is forked.  It is closed (heartbeat
  stopped, worker marked stopped) when that process shuts down.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery, signals

from stepq.workers import kinds as work_kinds
from stepq.workers.celery_options import CeleryOptions
from stepq.workers.full_broker import transport_for
from stepq.workers.jobqueue.job_kind import JobKind, Outlet, PartlyPublished
from stepq.workers.jobqueue.runner import run_jobs
from stepq.workers.jobqueue.runtime import WorkerRuntime
from stepq.workers.kinds import KINDS, ROLLOUTS

TASK_NAME = ROLLOUTS.task_name


def create_app(
    options: CeleryOptions,
    runtime_factory: Callable[[], WorkerRuntime] | None = None,
    *,
    forking_pool: bool = False,
    kinds: Sequence[JobKind] = KINDS,
) -> Celery:
    """Build the app, one task per kind; ``runtime_factory`` makes the runtime of each process
    that runs tasks (``forking_pool``: in each child after the fork, never in the parent)."""
    app = Celery("stepq", broker=options.broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        event_serializer="json",
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=options.queue,
        broker_transport_options={"visibility_timeout": options.visibility_timeout_s},
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        worker_send_task_events=True,
        task_send_sent_event=False,
        worker_hijack_root_logger=False,
        broker_transport=transport_for(options.broker_url),
    )
    state: dict[str, WorkerRuntime] = {}

    def runtime() -> WorkerRuntime:
        if "rt" not in state:
            if runtime_factory is None:
                raise RuntimeError("this app was built for publishing only")
            state["rt"] = runtime_factory().start()
        return state["rt"]

    def start_runtime(**_: object) -> None:
        runtime()

    def start_child_runtime(**_: object) -> None:
        state.clear()  # never use what a parent built before the fork
        runtime()

    def close_runtime(**_: object) -> None:
        rt = state.pop("rt", None)
        if rt is not None:
            rt.close()

    def stop_runtime(**_: object) -> None:
        rt = state.get("rt")
        if rt is not None:  # SIGTERM: tasks hand back their items after the batch in flight
            rt.request_stop()

    if runtime_factory is not None:
        signals.worker_shutting_down.connect(stop_runtime, weak=False)
        if forking_pool:
            signals.worker_process_init.connect(start_child_runtime, weak=False)
        else:  # solo / threads: this process runs the tasks; warm it before the first
            signals.worker_ready.connect(start_runtime, weak=False)
        signals.worker_process_shutdown.connect(close_runtime, weak=False)
        signals.worker_shutdown.connect(close_runtime, weak=False)
    app.stepq_runtime = runtime  # type: ignore[attr-defined]

    for kind in kinds:  # one thin task per kind of queue work
        _register(app, kind, runtime)

    app.stepq_queue = options.queue  # type: ignore[attr-defined]
    return app


def run_worker(app: Celery, argv: list[str]) -> None:
    """Celery's worker loop, whose end is a fault unless it was asked to stop: Celery exits 0
    whatever ended it (a broker that refused writes killed every worker with status 0, which a
    restart-on-failure supervisor reads as done).  Asked to stop (SIGTERM, SIGINT), it exits as
    Celery says; stopped by anything else, with the broker's exit code and the reason."""
    from stepq.models.errors import BrokerError

    asked = threading.Event()
    signals.worker_shutting_down.connect(lambda **_: asked.set(), weak=False)
    code: Any = 0
    try:
        app.worker_main(argv)
    except SystemExit as exc:
        code = exc.code
    if code not in (0, None) or asked.is_set():
        sys.exit(code)
    raise BrokerError(
        "the worker stopped without being asked to: its broker connection failed (the log above says how; "
        "a broker out of memory refuses the writes a worker's fetch makes). Nothing is lost: its items go back "
        "when their leases expire; start it again once the broker has room"
    )


PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0}
"""A publish gives up after about two seconds: the dispatcher then unmarks what it could not
publish and waits the outage out (``dispatcher.Outage``) instead of blocking in kombu's
reconnect loop, which never ends (``broker_connection_max_retries=None``) and would hold the
dispatcher lock unrenewed."""


def _reachable(producer: Any) -> None:
    """Connect now, retrying briefly: raises kombu's OperationalError when the broker is down."""
    producer.connection.ensure_connection(
        max_retries=PUBLISH_RETRY["max_retries"],
        interval_start=PUBLISH_RETRY["interval_start"],
        interval_step=PUBLISH_RETRY["interval_step"],
        interval_max=PUBLISH_RETRY["interval_max"],
    )


def _register(app: Celery, kind: JobKind, runtime: Callable[[], WorkerRuntime]) -> None:
    @app.task(name=kind.task_name, bind=True, acks_late=True, ignore_result=True, shared=False)
    def run(self: Any, job_ids: list[int] | int) -> str:
        ids = [int(job_ids)] if isinstance(job_ids, int) else [int(i) for i in job_ids]
        rt = runtime()
        done = run_jobs(rt, kind, ids)
        if not rt.health.healthy:  # stop consuming: every job it took failed (its heartbeat says why)
            _stop_consuming(app, self.request.hostname)
        return ",".join(f"{i}:{status}" for i, status in done.items())


def _stop_consuming(app: Celery, hostname: str | None) -> None:
    """Ask this worker (by its node name, through the broker: a prefork child cannot reach its
    parent's consumer) to stop consuming the queue; once is enough, asking again is harmless."""
    if not hostname:
        return
    try:
        app.control.cancel_consumer(app.stepq_queue, destination=[hostname])  # type: ignore[attr-defined]
    except Exception as exc:  # the messages it still gets are handed back unclaimed
        logging.getLogger("stepq.worker").warning("could not stop consuming (%s); handing work back instead", exc)


def publisher(app: Celery, kind: JobKind = ROLLOUTS, per_message: int = 1) -> Callable[[Sequence[int]], None]:
    """A function that publishes one kind's job ids, ``per_message`` to a message; used by the
    dispatcher.  A task runs its jobs together (for rollouts: one engine call serves them)."""
    queue: str = app.stepq_queue  # type: ignore[attr-defined]

    def publish(ids: Sequence[int]) -> None:
        sent: list[int] = []
        with app.producer_or_acquire() as producer:
            _reachable(producer)
            for start in range(0, len(ids), per_message):
                part = [int(i) for i in ids[start : start + per_message]]
                try:
                    app.send_task(
                        kind.task_name,
                        args=[part],
                        queue=queue,
                        exchange="",
                        routing_key=queue,
                        producer=producer,
                        ignore_result=True,
                        retry_policy=PUBLISH_RETRY,
                    )
                except Exception as exc:
                    if sent:
                        raise PartlyPublished(sent, exc) from exc
                    raise
                sent += part

    return publish


def outlets(app: Celery, rollouts_per_message: int, kinds: Sequence[JobKind] = KINDS) -> list[Outlet]:
    """Every kind of queue work, published through this app."""
    return work_kinds.outlets(lambda kind, per: publisher(app, kind, per), rollouts_per_message, kinds)


def wait_for_broker(broker_url: str, wait_s: float) -> None:
    """Reach the broker within ``wait_s`` seconds, or raise BrokerError: a worker or
    dispatcher started against a wrong or dead broker says so instead of retrying for ever."""
    import logging
    import time

    from kombu import Connection

    from stepq.models.errors import BrokerError, masked

    started = time.monotonic()
    deadline = started + wait_s
    safe = masked(broker_url)  # as given, password masked (kombu's as_uri shows one where none was set)
    tries = 0
    while True:
        tries += 1
        try:
            with Connection(broker_url, connect_timeout=5) as conn:
                conn.ensure_connection(max_retries=1)
            if tries > 1:
                logging.getLogger(__name__).info("broker %s reachable after %d tries", safe, tries)
            return
        except Exception as exc:
            if time.monotonic() >= deadline:
                raise BrokerError(f"cannot reach the broker at {safe} (gave up after {wait_s:g} s): {exc}") from None
            # every try is said: a minute of silence looks like a hang
            left = deadline - time.monotonic()
            logging.getLogger(__name__).warning(
                "broker %s unreachable (try %d: %s); trying again for %.0f s more", safe, tries, masked(str(exc)), left
            )
            time.sleep(min(2.0, max(0.0, left)))
