"""Long-running processes and their set-up: db upgrade, worker, dispatch, flower,
serve-synthetic."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import click

from stepq.commands.base import (
    backend_config,
    friendly,
    load_settings,
    main,
    open_db,
    setup_logging,
)
from stepq.models.errors import DatabaseError, missing_on_server
from stepq.settings import require_named_database
from stepq.workers.backends import BACKENDS as BACKEND_NAMES


@main.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@friendly
def db_upgrade(revision: str) -> None:
    """Migrate the database named by STEPQ_DATABASE_URL to the latest schema."""
    from stepq.migrations import current, upgrade

    settings = load_settings()
    try:
        upgrade(settings.database_url, revision)
    except Exception as exc:
        if "OperationalError" in type(exc).__name__:
            first = str(exc).splitlines()[0]
            missing = missing_on_server(first)
            raise DatabaseError(f"cannot migrate {settings.database_url}: {missing or first}") from None
        raise
    click.echo(f"database at revision {current(settings.database_url)}")


@main.command()
@click.option("--name", default=None, help="Worker name (default host:pid).")
@click.option(
    "--pool",
    type=click.Choice(["solo", "prefork", "threads"]),
    default="solo",
    show_default=True,
    help="solo: one task at a time in the main process (one per GPU).",
)
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--loglevel",
    type=click.Choice(["debug", "info", "warning", "error", "critical"], case_sensitive=False),
    default=None,
    help="Default: the settings' log level.",
)
@click.option(
    "--backend",
    type=click.Choice(BACKEND_NAMES),
    default=None,
    help="Generate with this backend for every set (default: each set's own backend).",
)
@click.option("--model", default=None, help="vllm/hf: model path or name; openai: the served model name.")
@click.option("--base-url", default=None, help="openai: the server's base URL, e.g. http://host:8000/v1.")
@click.option("--tensor-parallel-size", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--gpu-memory-utilization", type=click.FloatRange(0.05, 1.0), default=0.9, show_default=True)
@click.option(
    "--backend-option",
    "backend_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Any other backend setting (repeatable), e.g. concurrency=32.",
)
@friendly
def worker(
    name: str | None,
    pool: str,
    concurrency: int,
    loglevel: str | None,
    backend: str | None,
    model: str | None,
    base_url: str | None,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    backend_options: tuple[str, ...],
) -> None:
    """Run a Celery worker that pulls rollout work (one per GPU, concurrency 1)."""
    from stepq.assembly import QueueWorkerSpec, run_queue_worker

    settings = load_settings()
    require_named_database()  # before anything opens the database, which would make the stray file
    setup_logging(loglevel or settings.log_level, settings.log_format)
    engine_defaults = {"tensor_parallel_size": tensor_parallel_size, "gpu_memory_utilization": gpu_memory_utilization}
    config = backend_config(model, base_url, backend_options)
    spec = QueueWorkerSpec(name, pool, concurrency, loglevel, backend, config, engine_defaults)
    run_queue_worker(settings, spec)


@main.command()
@click.option("--once", is_flag=True, help="One cycle, then exit.")
@click.option("--interval", type=click.FloatRange(min=0.05), default=None, help="Seconds between cycles.")
@click.option("--wait", type=float, default=None, help="With --once: give up after waiting this long for the lock.")
@friendly
def dispatch(once: bool, interval: float | None, wait: float | None) -> None:
    """Publish missing work of every kind (rollouts, step searches, priority scorings) to the
    broker; only one dispatcher acts at a time."""
    from stepq.assembly import queue_dispatcher
    from stepq.workers.celery_app import wait_for_broker

    settings = load_settings()
    require_named_database()
    setup_logging(settings.log_level, settings.log_format)
    database = open_db(settings)
    wait_for_broker(settings.broker_url, settings.broker_wait_s)
    dispatcher, listener = queue_dispatcher(settings, database)
    stop = threading.Event()
    # SIGTERM (a supervisor's stop, docker stop) ends the loop the way Ctrl-C does: the lock is
    # released on the way out, so a standby dispatcher takes over at once, not after the lease
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    try:
        published = dispatcher.run(
            once=once, interval_s=interval or settings.dispatch_interval_s, wait_s=wait, stop=stop
        )
    except KeyboardInterrupt:
        published = 0
    finally:
        if listener:
            listener.close()
    click.echo(f"published {published} work items")


@main.command()
@click.option("--port", type=int, default=5555, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True, help="Listen address (loopback by default).")
@click.option(
    "--basic-auth-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="Require HTTP basic auth, USER:PASSWORD read from FILE (or from STEPQ_FLOWER_BASIC_AUTH); needed before "
    "listening beyond loopback.  Never on the command line, where every user's ps shows it.",
)
@click.option("--basic-auth", "on_command_line", default=None, hidden=True, expose_value=True)
@friendly
def flower(port: int, address: str, basic_auth_file: Path | None, on_command_line: str | None) -> None:
    """Celery's Flower dashboard for the stepq queue (needs the 'flower' extra)."""
    from stepq.models.errors import ConfigError
    from stepq.workers.celery_app import create_app

    if on_command_line is not None:  # said, not obeyed: the password is already in ps
        raise ConfigError(
            "--basic-auth puts the password on the command line, where every user's ps shows it: "
            "set STEPQ_FLOWER_BASIC_AUTH=USER:PASSWORD or give --basic-auth-file FILE"
        )
    basic_auth = flower_credentials(basic_auth_file)
    if address not in ("127.0.0.1", "localhost", "::1") and not basic_auth:
        raise ConfigError(
            f"Flower on {address} would let anyone on the network see and control the queue: "
            "set STEPQ_FLOWER_BASIC_AUTH=USER:PASSWORD (or --basic-auth-file FILE), or keep the loopback default"
        )
    try:
        import flower as _flower  # noqa: F401
    except ImportError:
        raise ConfigError("Flower is not installed: pip install 'stepq[flower]'") from None
    settings = load_settings()
    argv = ["flower", f"--port={port}", f"--address={address}"]
    if basic_auth:
        argv.append(f"--basic-auth={basic_auth}")
    create_app(settings.celery_options()).start(argv)


def flower_credentials(path: Path | None) -> str | None:
    """USER:PASSWORD for Flower from a file or the environment (a process's environment is its
    own user's to read; its argv is everyone's)."""
    import os

    from stepq.models.errors import ConfigError

    if path is None:
        return os.environ.get("STEPQ_FLOWER_BASIC_AUTH") or None
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"--basic-auth-file {path}: cannot read it ({exc.strerror})") from None
    if ":" not in value:
        raise ConfigError(f"--basic-auth-file {path}: expected one line USER:PASSWORD")
    return value


@main.command()
@click.option("--port", type=int, default=9464, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True, help="Listen address (loopback by default).")
@friendly
def metrics(port: int, address: str) -> None:
    """Serve Prometheus metrics for the whole fleet at /metrics (read from the database)."""
    import threading

    from prometheus_client import start_http_server
    from prometheus_client.registry import CollectorRegistry

    from stepq.metrics import StepqCollector
    from stepq.workers.jobqueue.broker_contents import redis_queue_depth

    settings = load_settings()
    setup_logging(settings.log_level, settings.log_format)
    registry = CollectorRegistry()
    depth = redis_queue_depth(settings.broker_url, settings.queue)
    registry.register(StepqCollector(open_db(settings), depth, settings.dispatch_options()))
    server, thread = start_http_server(port, addr=address, registry=registry)
    click.echo(f"serving stepq metrics at http://{address}:{server.server_port}/metrics")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()
        thread.join(timeout=5)


@main.command("worker-alive")
@click.option("--host", default=None, help="The worker's host (default: this one, as a probe in its container runs).")
@click.option("--max-age", type=click.FloatRange(min=1), default=60.0, show_default=True, help="Seconds.")
@friendly
def worker_alive(host: str | None, max_age: float) -> None:
    """Exit 0 when this host's worker wrote a heartbeat within --max-age seconds and takes work,
    1 otherwise (a liveness probe for Kubernetes and other supervisors)."""
    import socket

    from stepq.status import worker_liveness

    alive, why = worker_liveness(open_db(load_settings()), host or socket.gethostname(), max_age)
    click.echo(why, err=not alive)
    sys.exit(0 if alive else 1)


@main.command("serve-synthetic")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--error-rate", type=click.FloatRange(0, 1), default=0.1, show_default=True)
@click.option("--recovery-rate", type=click.FloatRange(0, 1), default=0.001, show_default=True)
def serve_synthetic(host: str, port: int, error_rate: float, recovery_rate: float) -> None:
    """Serve the synthetic policy as an OpenAI-compatible /v1/completions endpoint."""
    from stepq.workers.backends.synthetic_server import SyntheticCompletionsServer

    server = SyntheticCompletionsServer(host, port, error_rate=error_rate, recovery_rate=recovery_rate)
    click.echo(f"serving the synthetic policy at {server.url}/completions")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.stop()
