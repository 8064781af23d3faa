"""The ``stepq`` command line: thin commands over the models and workers packages."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from stepq.models import Database
from stepq.models.errors import BrokerError, DatabaseError, StepqError
from stepq.settings import Settings
from stepq.workers.backends import BACKENDS as BACKEND_NAMES

F = TypeVar("F", bound=Callable[..., Any])
INTERNAL_ERROR = 70  # EX_SOFTWARE: a bug or an unforeseen failure, not a user error


def friendly(fn: F) -> F:
    """Turn user-facing errors into one line on stderr and a non-zero exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from kombu.exceptions import OperationalError as KombuOperationalError
        from sqlalchemy.exc import OperationalError

        try:
            return fn(*args, **kwargs)
        except StepqError as exc:
            click.echo(f"stepq: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except OperationalError as exc:
            first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            err = DatabaseError(f"database error: {first}")
            click.echo(f"stepq: error: {err}", err=True)
            sys.exit(err.exit_code)
        except KombuOperationalError as exc:
            err2 = BrokerError(f"cannot reach the broker: {exc}")
            click.echo(f"stepq: error: {err2}", err=True)
            sys.exit(err2.exit_code)
        except click.ClickException:
            raise
        except Exception as exc:
            if os.environ.get("STEPQ_DEBUG"):
                raise
            click.echo(
                f"stepq: internal error: {type(exc).__name__}: {exc} (set STEPQ_DEBUG=1 for the traceback)", err=True
            )
            sys.exit(INTERNAL_ERROR)

    return wrapper  # type: ignore[return-value]


def _settings() -> Settings:
    return Settings.from_env()


def _db(settings: Settings, *, migrate: bool = False) -> Database:
    if migrate:
        from stepq.migrations import upgrade

        upgrade(settings.database_url)
    db = Database(settings.database_url)
    db.check()
    return db


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@click.group()
@click.version_option(package_name="stepq")
def main() -> None:
    """stepq: Monte Carlo step labels for chains of thought, as a resumable job queue."""


@main.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@friendly
def db_upgrade(revision: str) -> None:
    """Migrate the database named by STEPQ_DATABASE_URL to the latest schema."""
    from stepq.migrations import current, upgrade

    settings = _settings()
    try:
        upgrade(settings.database_url, revision)
    except Exception as exc:
        if "OperationalError" in type(exc).__name__:
            raise DatabaseError(f"cannot migrate {settings.database_url}: {str(exc).splitlines()[0]}") from None
        raise
    click.echo(f"database at revision {current(settings.database_url)}")


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--set", "set_name", required=True, help="Problem set to add the records to.")
@click.option("--question", default=None, help="Question field (default: problem, question or prompt).")
@click.option("--answer", default="answer", show_default=True, help="Reference answer field; '-' for none.")
@click.option(
    "--answer-format",
    type=click.Choice(["auto", "plain", "gsm8k"]),
    default="auto",
    show_default=True,
    help="gsm8k: the final answer follows '####'; auto detects it.",
)
@click.option("--id", "id_field", default=None, help="Id field (default: unique_id, id or idx; else a content hash).")
@click.option("--steps", default=None, help="Field with a list of solution steps: ingest them as a trajectory.")
@click.option("--outcome", default=None, help="Boolean field: the trajectory's outcome (else graded).")
@click.option("--first-error", default=None, help="Field: 0-based index of the first wrong step, -1 if none.")
@friendly
def ingest(
    file: Path,
    set_name: str,
    question: str | None,
    answer: str,
    answer_format: str,
    id_field: str | None,
    steps: str | None,
    outcome: str | None,
    first_error: str | None,
) -> None:
    """Add problems (and given trajectories) from a JSONL file or a JSON array."""
    from stepq.workers.ingest import FieldMap, ingest_file

    settings = _settings()
    database = _db(settings, migrate=settings.embedded)
    fields = FieldMap(
        question=question,
        answer=None if answer == "-" else answer,
        id=id_field,
        steps=steps,
        outcome=outcome,
        first_error=first_error,
        answer_format=answer_format,
    )
    report = ingest_file(database, file, set_name, fields)
    click.echo(
        f"{file}: {report.records} records, {report.new_problems} new problems, "
        f"{report.new_trajectories} new trajectories in set '{set_name}'"
    )


@main.command()
@click.option("--set", "set_name", required=True)
@click.option("--problems", type=click.IntRange(min=1), required=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--trajectories-per-problem", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--error-rate", type=click.FloatRange(0, 1), default=0.1, show_default=True)
@click.option("--recovery-rate", type=click.FloatRange(0, 1), default=0.001, show_default=True)
@click.option(
    "--latency-s",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Simulated generation time per rollout.",
)
@friendly
def synth(
    set_name: str,
    problems: int,
    seed: int,
    trajectories_per_problem: int,
    error_rate: float,
    recovery_rate: float,
    latency_s: float,
) -> None:
    """Create a synthetic arithmetic problem set with policy trajectories of known truth."""
    from stepq.workers.synthetic_set import synth_set

    settings = _settings()
    database = _db(settings, migrate=settings.embedded)
    report = synth_set(
        database,
        set_name,
        problems=problems,
        seed=seed,
        trajectories_per_problem=trajectories_per_problem,
        error_rate=error_rate,
        recovery_rate=recovery_rate,
        latency_s=latency_s,
    )
    click.echo(f"set '{set_name}': {report.new_problems} new problems, {report.new_trajectories} new trajectories")


@main.command()
@click.option("--set", "set_name", required=True)
@click.option("--rollouts", "m", type=click.IntRange(min=1), required=True, help="Rollouts per prefix (M).")
@click.option("--rule", default=None, help="Label rule, e.g. abs-q or rel-ratio:gamma=0.7.")
@click.option("--budget", default=None, help="exhaustive, or adaptive[:confidence=C,min=N,round=R].")
@click.option("--backend", type=click.Choice(BACKEND_NAMES), default=None, help="The set's generation backend.")
@click.option("--model", default=None, help="Backend model (path or served name).")
@click.option("--base-url", default=None, help="openai: the server's base URL.")
@click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE")
@click.option("--temperature", type=float, default=None, help="Rollout sampling temperature (default 1.0).")
@click.option("--top-p", type=float, default=None)
@click.option("--max-tokens", type=int, default=None, help="Most new tokens per rollout (default 8192).")
@friendly
def annotate(
    set_name: str,
    m: int,
    rule: str | None,
    budget: str | None,
    backend: str | None,
    model: str | None,
    base_url: str | None,
    backend_options: tuple[str, ...],
    temperature: float | None,
    top_p: float | None,
    max_tokens: int | None,
) -> None:
    """Set a problem set's budget and plan its missing rollouts (only what is missing)."""
    from stepq.workers.planning import configure_annotation

    settings = _settings()
    config = _backend_config(model, base_url, backend_options)
    sampling = {
        k: v for k, v in {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}.items() if v is not None
    }
    report = configure_annotation(
        _db(settings, migrate=settings.embedded),
        set_name,
        m,
        rule=rule,
        budget=budget,
        backend=backend,
        backend_config=config,
        sampling=sampling,
    )
    click.echo(
        f"set '{set_name}': M={report.rollouts_per_prefix}, rule {report.label_rule}, "
        f"budget {report.budget_policy}; {report.work_items} work items planned or reopened"
    )


@main.command()
@click.option("--set", "set_name", required=True)
@click.option("--rule", required=True, help="abs-q, rel-ratio[:gamma=G] or rel-effective[:alpha=A].")
@click.option("--default/--no-default", "make_default", default=False, help="Also make it the set's rule.")
@friendly
def label(set_name: str, rule: str, make_default: bool) -> None:
    """Recompute labels for a rule from stored rollouts, without sampling again."""
    from stepq.workers.labels import parse_rule
    from stepq.workers.qvalues import relabel_set

    parsed = parse_rule(rule)
    report = relabel_set(_db(_settings()), set_name, parsed, make_default=make_default)
    click.echo(f"set '{set_name}': {report.labelled} chunks labelled under {parsed.key}")
    if report.undecided:
        click.echo(
            f"{report.undecided} chunks need more rollouts under this rule and budget: "
            f"run 'stepq annotate --set {set_name} --rollouts M --rule {parsed.key}'"
        )


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
@click.option("--loglevel", default=None)
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
    from stepq.workers.annotate import WorkerRuntime
    from stepq.workers.backends import make_backend
    from stepq.workers.celery_app import create_app
    from stepq.workers.grading import Grader

    settings = _settings()
    _setup_logging(loglevel or settings.log_level)
    _db(settings).dispose()
    config = _backend_config(
        model,
        base_url,
        backend_options,
        tensor_parallel_size=tensor_parallel_size,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    # The engine is built once, here, and kept warm for every task this process runs.
    override = make_backend(backend, config) if backend else None

    def runtime() -> WorkerRuntime:
        database = Database(settings.database_url, pool_size=2, synchronous_commit=settings.synchronous_commit)
        return WorkerRuntime(
            database,
            settings.worker_options(name),
            Grader(timeout_s=settings.grade_timeout_s),
            backend_override=override,
        )

    app = create_app(settings.celery_options(), runtime)
    argv = [
        "worker",
        f"--pool={pool}",
        f"--concurrency={concurrency}",
        f"--queues={settings.queue}",
        f"--loglevel={(loglevel or settings.log_level).upper()}",
        "--without-gossip",
        "--without-mingle",
    ]
    if name:
        argv.append(f"--hostname={name}@%h")
    app.worker_main(argv)


def _key_values(items: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            from stepq.models.errors import ConfigError

            raise ConfigError(f"expected KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


@main.command()
@click.option("--once", is_flag=True, help="One cycle, then exit.")
@click.option("--interval", type=click.FloatRange(min=0.05), default=None, help="Seconds between cycles.")
@click.option("--wait", type=float, default=None, help="With --once: give up after waiting this long for the lock.")
@friendly
def dispatch(once: bool, interval: float | None, wait: float | None) -> None:
    """Publish missing work to the broker; only one dispatcher acts at a time."""
    from stepq.workers.celery_app import create_app, publisher, redis_queue_depth
    from stepq.workers.dispatcher import Dispatcher

    settings = _settings()
    _setup_logging(settings.log_level)
    database = _db(settings)
    app = create_app(settings.celery_options())
    dispatcher = Dispatcher(
        database,
        publisher(app, settings.items_per_task),
        options=settings.dispatch_options(),
        queue_depth=redis_queue_depth(settings.broker_url, settings.queue),
    )
    try:
        published = dispatcher.run(once=once, interval_s=interval or settings.dispatch_interval_s, wait_s=wait)
    except KeyboardInterrupt:
        published = 0
    click.echo(f"published {published} work items")


@main.command()
@click.option("--set", "set_name", default=None, help="Only this problem set (default: all).")
@friendly
def retry(set_name: str | None) -> None:
    """Give failed work items another round of attempts (after fixing what made them fail)."""
    from stepq.models import queries

    database = _db(_settings())
    with database.session() as s:
        set_id = queries.get_set(s, set_name).id if set_name else None
        n = queries.retry_failed(s, set_id)
    click.echo(f"{n} failed work items are pending again")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@friendly
def status(as_json: bool) -> None:
    """Progress per problem set: rollouts done/planned, labels, rate, ETA."""
    from stepq.status import collect, render

    report = collect(_db(_settings()))
    click.echo(json.dumps(report, indent=2) if as_json else render(report))


@main.command()
@click.option("--set", "set_name", default="demo", show_default=True)
@click.option(
    "--synthetic",
    "n_synth",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    help="Synthetic problems to create when the set does not exist yet.",
)
@click.option("--rollouts", "m", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--rule", default=None, help="Label rule (default: the set's, abs-q for a new set).")
@click.option("--budget", default=None, help="exhaustive or adaptive[:...] (default: the set's).")
@friendly
def run(set_name: str, n_synth: int, m: int, seed: int, rule: str | None, budget: str | None) -> None:
    """The embedded default: problems to labels in this process (SQLite, no services)."""
    from stepq.embedded import run_embedded

    settings = _settings()
    run_embedded(settings, set_name, n_synth=n_synth, m=m, seed=seed, rule=rule, budget=budget, echo=click.echo)


@main.command()
@click.option("--port", type=int, default=5555, show_default=True)
@click.option("--address", default="0.0.0.0", show_default=True)
@friendly
def flower(port: int, address: str) -> None:
    """Celery's Flower dashboard for the stepq queue (needs the 'flower' extra)."""
    from stepq.workers.celery_app import create_app

    try:
        import flower as _flower  # noqa: F401
    except ImportError:
        from stepq.models.errors import ConfigError

        raise ConfigError("Flower is not installed: pip install 'stepq[flower]'") from None
    settings = _settings()
    create_app(settings.celery_options()).start(["flower", f"--port={port}", f"--address={address}"])


def _backend_config(model: str | None, base_url: str | None, options: tuple[str, ...], **extra: Any) -> dict[str, Any]:
    """A backend config from the common flags plus ``--backend-option KEY=VALUE`` pairs."""
    config = {"model": model, "base_url": base_url, **extra, **_key_values(options)}
    return {k: v for k, v in config.items() if v is not None}


def _backend_from_options(backend: str, model: str | None, base_url: str | None, options: tuple[str, ...]) -> Any:
    from stepq.workers.backends import make_backend

    return make_backend(backend, _backend_config(model, base_url, options))


@main.command()
@click.option("--set", "set_name", required=True)
@click.option("--samples", type=click.IntRange(min=1), required=True, help="Trajectories per problem (K).")
@click.option("--template", default=None, help="chunk (StepWiser <chunk> tags), step ('Step n:') or synthetic.")
@click.option("--template-file", type=click.Path(path_type=Path), default=None, help="A template with {question}.")
@click.option(
    "--segmentation",
    type=click.Choice(["auto", "chunk-tags", "step-markers", "blank-lines", "llm"]),
    default="auto",
    show_default=True,
)
@click.option(
    "--filter-mixed",
    is_flag=True,
    help="Keep only problems whose K outcomes are neither all right nor "
    "all wrong (the paper's prompt filter); the others are excluded from annotation.",
)
@click.option("--backend", type=click.Choice(BACKEND_NAMES), default=None, help="Default: the set's backend.")
@click.option("--model", default=None)
@click.option("--base-url", default=None)
@click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE")
@click.option("--segmenter-model", default=None, help="With --segmentation llm: the segmenting model (same backend).")
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--max-tokens", type=int, default=8192, show_default=True)
@friendly
def generate(
    set_name: str,
    samples: int,
    template: str | None,
    template_file: Path | None,
    segmentation: str,
    filter_mixed: bool,
    backend: str | None,
    model: str | None,
    base_url: str | None,
    backend_options: tuple[str, ...],
    segmenter_model: str | None,
    temperature: float,
    top_p: float,
    max_tokens: int,
) -> None:
    """Sample K policy trajectories per problem (only the missing ones), then segment them."""
    from stepq.models import queries
    from stepq.workers.backends import SamplingParams
    from stepq.workers.generate import generate_trajectories
    from stepq.workers.prompts import load_template

    settings = _settings()
    database = _db(settings, migrate=settings.embedded)
    with database.session() as s:
        pset = queries.get_set(s, set_name)
        name, config = backend or pset.backend, dict(pset.backend_config)
    policy = _backend_from_options(name, model, base_url, backend_options) if backend else None
    if policy is None:
        from stepq.workers.backends import make_backend

        policy = make_backend(name, config)
    chosen = template or ("synthetic" if name == "synthetic" else "chunk")
    segmenter = None
    if segmentation == "llm":
        segmenter = _backend_from_options(name, segmenter_model or model, base_url, backend_options)
    report = generate_trajectories(
        database,
        set_name,
        policy,
        samples=samples,
        template=load_template(None if template_file else chosen, template_file),
        params=SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens),
        segmentation=segmentation,
        segmenter=segmenter,
        filter_mixed=filter_mixed,
    )
    methods = ", ".join(f"{k} {v}" for k, v in sorted(report.segmentation.items())) or "none"
    click.echo(
        f"set '{set_name}': {report.new_trajectories} new trajectories for {report.problems} problems "
        f"(segmentation: {methods})"
    )
    if filter_mixed:
        click.echo(f"prompt filter: {report.excluded_problems} problems excluded (all right or all wrong)")


@main.command()
@click.option("--set", "set_name", required=True)
@click.option(
    "--method", type=click.Choice(["auto", "chunk-tags", "step-markers", "blank-lines", "llm"]), required=True
)
@click.option("--backend", type=click.Choice(BACKEND_NAMES), default=None, help="With --method llm: the segmenter.")
@click.option("--model", default=None)
@click.option("--base-url", default=None)
@click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE")
@friendly
def segment(
    set_name: str,
    method: str,
    backend: str | None,
    model: str | None,
    base_url: str | None,
    backend_options: tuple[str, ...],
) -> None:
    """Segment a set's not-yet-annotated trajectories again, e.g. with a model (--method llm)."""
    from stepq.models.errors import ConfigError
    from stepq.workers.generate import resegment_set

    if method == "llm" and backend is None:
        raise ConfigError("--method llm needs --backend (and --model) for the segmenting model")
    segmenter = _backend_from_options(backend, model, base_url, backend_options) if backend else None
    report = resegment_set(_db(_settings()), set_name, method, segmenter=segmenter)
    methods = ", ".join(f"{k} {v}" for k, v in sorted(report.segmentation.items())) or "none"
    click.echo(
        f"set '{set_name}': {report.resegmented} trajectories segmented ({methods}); "
        f"{report.skipped_with_rollouts} left alone because they already have rollouts"
    )


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


# The trainer's commands (snapshot, train, trainer, eval) live in their own module; importing
# it registers them on ``main``.
from stepq import trainer_cli  # noqa: E402,F401
