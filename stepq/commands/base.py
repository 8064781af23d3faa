"""What every command shares: the ``stepq`` group, settings, database opening, error translation
(one line on stderr and a documented exit code) and the backend option helpers."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import click

from stepq.models import Database
from stepq.models.errors import BrokerError, ConfigError, DatabaseError, Interrupted, StepqError, cause_of, masked
from stepq.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])
INTERNAL_ERROR = 70  # EX_SOFTWARE: a bug or an unforeseen failure, not a user error
EXTRAS = {
    **dict.fromkeys(("torch", "transformers", "tokenizers"), "hf"),
    "datasets": "datasets",
    **dict.fromkeys(("trl", "accelerate", "deepspeed"), "train"),
    "vllm": "vllm",
    "flower": "flower",
    "matplotlib": "bench",
}
"""The optional packages commands import, and the smallest extra of ``pyproject.toml`` that
installs each (``--backend hf`` needs ``hf``, ``ingest --hf`` needs ``datasets``)."""
TRAINING_COMMANDS = ("train", "trainer")
"""Commands that need the whole ``train`` extra: naming a smaller one would only move the error."""


def missing_extra(exc: ModuleNotFoundError, command: str = "") -> str | None:
    """The install command for an optional package a command needed, or None for any other
    missing module (a broken install: an internal error); ``command``, the subcommand run."""
    extra = EXTRAS.get((exc.name or "").split(".")[0])
    if extra in ("hf", "datasets") and command in TRAINING_COMMANDS:
        extra = "train"
    return None if extra is None else f"pip install 'stepq[{extra}]'"


def _subcommand() -> str:
    """The first subcommand of the running command line (``train`` in ``stepq train ...``)."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None and ctx.parent is not None and ctx.parent.parent is not None:
        ctx = ctx.parent
    return ctx.info_name or "" if ctx is not None else ""


def friendly(fn: F) -> F:
    """Turn user-facing errors into one line on stderr and a non-zero exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from kombu.exceptions import OperationalError as KombuOperationalError
        from sqlalchemy.exc import OperationalError

        try:
            return fn(*args, **kwargs)
        except StepqError as exc:
            if isinstance(exc, Interrupted) and threading.current_thread() is threading.main_thread():
                # the operator's stop, on its way out: another Ctrl-C landing now (in this
                # handler, where no sibling clause catches it) must not turn exit 130 into
                # death by signal
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            click.echo(masked(f"stepq: error: {exc}"), err=True)
            sys.exit(exc.exit_code)
        except OperationalError as exc:
            first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            err = DatabaseError(f"database error, {cause_of(first)}: {first}")
            click.echo(masked(f"stepq: error: {err}"), err=True)
            sys.exit(err.exit_code)
        except KombuOperationalError as exc:
            cause = cause_of(str(exc))
            err2 = BrokerError(
                f"cannot reach the broker: {exc}" if cause == "unreachable" else f"broker error, {cause}: {exc}"
            )
            click.echo(masked(f"stepq: error: {err2}"), err=True)
            sys.exit(err2.exit_code)
        except click.ClickException:
            raise
        except KeyboardInterrupt:  # a second Ctrl-C (the first is a warm stop where a command has one)
            click.echo("stepq: interrupted: the work in hand went back to pending, no attempt spent", err=True)
            sys.exit(Interrupted.exit_code)
        except Exception as exc:
            install = missing_extra(exc, _subcommand()) if isinstance(exc, ModuleNotFoundError) else None
            if install is not None:
                name = getattr(exc, "name", "")
                click.echo(f"stepq: error: this command needs {name}, which is not installed: {install}", err=True)
                sys.exit(ConfigError.exit_code)
            if os.environ.get("STEPQ_DEBUG"):
                raise
            click.echo(
                masked(f"stepq: internal error: {type(exc).__name__}: {exc} (set STEPQ_DEBUG=1 for the traceback)"),
                err=True,
            )
            sys.exit(INTERNAL_ERROR)

    return wrapper  # type: ignore[return-value]


def load_settings() -> Settings:
    return Settings.from_env()


def client(settings: Settings | None = None) -> Any:
    """The Python API's ``Stepq`` on these settings (an embedded database migrated on first
    use): the commands that have a library call make it through the API a script uses."""
    from stepq.api import Stepq

    return Stepq(settings=settings or load_settings())


def open_db(settings: Settings, *, migrate: bool = False) -> Database:
    if migrate:
        from stepq.migrations import upgrade

        upgrade(settings.database_url)
    db = Database(settings.database_url, guards=settings.session_guards())
    db.check()
    return db


def setup_logging(level: str, fmt: str = "text") -> None:
    from stepq.log_setup import setup_logging as configure

    configure(level, fmt)


@click.group()
@click.version_option(package_name="stepq")
def main() -> None:
    """stepq: Monte Carlo step labels for chains of thought, as a resumable job queue."""


def key_values(items: tuple[str, ...]) -> dict[str, Any]:
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


def backend_config(model: str | None, base_url: str | None, options: tuple[str, ...], **extra: Any) -> dict[str, Any]:
    """A backend config from the common flags plus ``--backend-option KEY=VALUE`` pairs."""
    config = {"model": model, "base_url": base_url, **extra, **key_values(options)}
    return {k: v for k, v in config.items() if v is not None}


def backend_from_options(backend: str, model: str | None, base_url: str | None, options: tuple[str, ...]) -> Any:
    from stepq.workers.backends import make_backend

    key = load_settings().openai_api_key or None
    return make_backend(backend, backend_config(model, base_url, options), api_key=key)
