"""All configuration in one typed object, read from the environment once and passed down."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from stepq.models.db import SessionGuards
from stepq.models.errors import ConfigError, masked
from stepq.workers.celery_options import DEFAULT_QUEUE, CeleryOptions
from stepq.workers.jobqueue.dispatcher import DispatchOptions
from stepq.workers.jobqueue.job_kind import JobKind, RetryPolicy, with_retry
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.kinds import KINDS

PREFIX = "STEPQ_"
BROKER_SCHEMES = ("redis", "rediss", "amqp", "amqps", "pyamqp", "memory")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def require_named_database(env: Mapping[str, str] | None = None) -> None:
    """A worker or dispatcher serves a fleet, so its database is named, never defaulted: left
    unset, the default SQLite file in the working directory is a stray database that no other
    process sees, and the fleet's broker would be served from it."""
    if not (os.environ if env is None else env).get(PREFIX + "DATABASE_URL"):
        raise ConfigError(
            f"{PREFIX}DATABASE_URL is not set: a worker or dispatcher serves the fleet's database "
            f"(postgresql://...); to use a local SQLite file, name it ({PREFIX}DATABASE_URL=sqlite:///stepq.db)"
        )


@dataclass(frozen=True)
class Settings:
    """Every field can be set as ``STEPQ_<FIELD>`` (upper case)."""

    database_url: str = ""
    """SQLAlchemy URL (``postgresql://`` is read as ``postgresql+psycopg://``); default: a
    SQLite file ``stepq.db`` in the working directory."""
    broker_url: str = "redis://127.0.0.1:6379/0"
    """The Celery broker."""
    queue: str = DEFAULT_QUEUE
    """The broker queue's name."""
    lease_ttl_s: float = WorkerOptions.lease_ttl_s
    """How long a worker's claim on a work item or a step search lasts without a heartbeat."""
    heartbeat_s: float = WorkerOptions.heartbeat_s
    """Seconds between worker heartbeats (each renews the worker's leases; at most a third
    of the lease is used, whatever is set), so a ``generate`` call or a search turn longer
    than the lease keeps its work."""
    batch_rollouts: int = WorkerOptions.batch_rollouts
    """Rollouts of one trajectory generated, graded and committed together: the most a crash
    loses per trajectory (an adaptive round is never split when it fits)."""
    items_per_task: int = 4
    """Trajectories per Celery task; their batches go to the engine in one ``generate`` call."""
    max_attempts: int = RetryPolicy.max_attempts
    """Attempts before a work item is marked failed (a permanent error, e.g. an HTTP 400 for
    a context over the model's limit, fails it at once)."""
    retry_backoff_s: float = RetryPolicy.backoff_s
    """A transiently failed item (timeout, 5xx, refused connection) waits this long before its
    next try, doubling each time, at most 10 minutes."""
    messages_per_worker: int = 2
    """Broker messages kept queued per live worker (at least 2): the queue's bound; the
    backlog waits in the database."""
    split_tail: bool = DispatchOptions.split_tail
    """Near the end of the backlog, publish messages of fewer than ``items_per_task``
    trajectories (down to one), so the last minutes of a set keep every worker busy; off:
    every message is full (the most trajectories per engine call to the end)."""
    broker_wait_s: float = 60.0
    """How long a worker or dispatcher waits for an unreachable broker at start before it
    exits with the broker exit code (6); once running, a lost broker is reconnected to."""
    visibility_timeout_s: int = 12 * 3600
    """Redis visibility timeout; must exceed the lease TTL."""
    requeue_after_s: float = DispatchOptions.requeue_after_s
    """Only for a broker whose queue depth cannot be read (not Redis): a queued item or search
    this old is presumed lost."""
    lost_grace_s: float = DispatchOptions.lost_grace_s
    """A queued item is published again when the broker queue is empty and it was queued
    this long ago (its message is surely lost)."""
    dispatch_interval_s: float = 2.0
    """Seconds between dispatcher cycles."""
    grade_timeout_s: int = 3
    """math-verify's timeout per answer; it holds in every pool (math-verify runs in a verify
    subprocess, killed when it overruns)."""
    write_behind: bool = True
    """A queue worker commits a trajectory's last batch on a background thread while its next
    task generates (the engine does not wait on the database); the job stays leased until
    committed."""
    store_rollout_text: bool = WorkerOptions.store_text
    """Keep rollout texts; at tens of millions of rollouts dropping them saves most of the space."""
    synchronous_commit: bool = False
    """PostgreSQL synchronous_commit for workers; off is safe here (see models.db)."""
    log_level: str = "INFO"
    """Python logging level."""
    log_format: str = "text"
    """text, or json: one JSON object per line with worker, set and item."""
    generate_timeout_s: float = 1800.0
    """A worker's generate call (or search turn) still running after this long is presumed hung
    (an engine or server that stopped answering): the work it holds fails an attempt (retried
    with backoff, given up after the retry limit, its error recorded) and the worker exits with
    code 69 for its supervisor to restart it.  0 turns the deadline off."""
    trainer_lease_ttl_s: float = 120.0
    """A trainer's claim on a training run (and a trainer service's on its lineage) lasts this
    long without a step; a killed trainer's run is taken over after it."""
    db_idle_transaction_timeout_s: float = SessionGuards.idle_in_transaction_s
    """PostgreSQL ends a session left idle inside a transaction this long (a frozen process),
    so its locks cannot stall the fleet; 0: off (see models.db.SessionGuards)."""
    db_lock_timeout_s: float = SessionGuards.lock_s
    """A PostgreSQL statement waits at most this long for a lock, then fails and is retried; 0: off."""
    db_statement_timeout_s: float = SessionGuards.statement_s
    """No PostgreSQL statement of stepq's runs longer; 0: off."""
    db_keepalive_idle_s: int = SessionGuards.keepalive_idle_s
    """TCP keepalives to and from PostgreSQL after this much silence, so a vanished host is
    noticed in about a minute; 0: off."""
    unhealthy_after: int = 10
    """A queue worker whose last this many jobs in a row failed (transient errors: a backend that
    cannot generate) stops taking work and shows as unhealthy in ``stepq status`` and the
    metrics, with the last error, until it is restarted; 0: never."""
    openai_api_key: str = field(default="", repr=False)
    """The key an OpenAI-compatible server (the openai backend) is called with, unless the
    backend's config names one; handed to the backends, never stored in the database or printed."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            kind = type(getattr(cls, f.name))
            if kind is bool:
                if raw.lower() not in {"1", "0", "true", "false", "on", "off", "yes", "no"}:
                    raise ConfigError(f"{PREFIX}{f.name.upper()}={raw!r} is not a boolean")
                values[f.name] = raw.lower() in {"1", "true", "on", "yes"}
                continue
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise ConfigError(f"{PREFIX}{f.name.upper()}={raw!r} is not a valid {kind.__name__}") from None
            if kind is float and not math.isfinite(values[f.name]):
                # nan compares false with everything: a lease that never expires, a timeout never hit
                raise ConfigError(f"{PREFIX}{f.name.upper()}={raw!r} is not a finite number")
        settings = cls(**values)
        if not settings.database_url:
            settings = replace(settings, database_url=f"sqlite:///{Path.cwd() / 'stepq.db'}")
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.database_url.startswith(("postgres://", "postgres+")):  # what hosted databases hand out
            object.__setattr__(self, "database_url", "postgresql" + self.database_url[len("postgres") :])
        if not self.database_url.startswith(("sqlite", "postgresql")):
            raise ConfigError(
                f"{PREFIX}DATABASE_URL must be a sqlite:// or postgresql:// (or postgres://) URL, "
                f"got {masked(self.database_url)!r}"
            )
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"{PREFIX}LOG_FORMAT must be text or json, got {self.log_format!r}")
        if self.log_level.upper() not in LOG_LEVELS:
            raise ConfigError(f"{PREFIX}LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                raise ConfigError(f"{PREFIX}{f.name.upper()} must not be negative, got {value!r}")
        scheme, sep, rest = self.broker_url.partition("://")
        if not sep or not rest or scheme not in BROKER_SCHEMES:
            raise ConfigError(
                f"{PREFIX}BROKER_URL={self.broker_url!r} is not a broker URL "
                f"(scheme one of {', '.join(BROKER_SCHEMES)}, e.g. redis://host:6379/0)"
            )
        if "password=" in rest.lower().partition("?")[2]:
            raise ConfigError(
                f"{PREFIX}BROKER_URL: give the broker's password in the URL's user part "
                f"({scheme}://:PASSWORD@host:port/db), not as a query parameter"
            )
        if self.database_url.startswith("postgresql://"):
            object.__setattr__(
                self, "database_url", "postgresql+psycopg://" + self.database_url[len("postgresql://") :]
            )
        for name in (
            "lease_ttl_s",
            "heartbeat_s",
            "batch_rollouts",
            "items_per_task",
            "max_attempts",
            "messages_per_worker",
            "visibility_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{PREFIX}{name.upper()} must be positive")
        if self.generate_timeout_s < 0:
            raise ConfigError(f"{PREFIX}GENERATE_TIMEOUT_S must be >= 0 (0: no deadline)")
        if self.visibility_timeout_s <= self.lease_ttl_s:
            raise ConfigError(f"{PREFIX}VISIBILITY_TIMEOUT_S must exceed {PREFIX}LEASE_TTL_S")

    def session_guards(self) -> SessionGuards:
        return SessionGuards(
            idle_in_transaction_s=self.db_idle_transaction_timeout_s,
            lock_s=self.db_lock_timeout_s,
            statement_s=self.db_statement_timeout_s,
            keepalive_idle_s=self.db_keepalive_idle_s,
        )

    @property
    def embedded(self) -> bool:
        return self.database_url.startswith("sqlite")

    def worker_options(self, name: str | None = None, *, queue_worker: bool = False) -> WorkerOptions:
        """``queue_worker``: a ``stepq worker`` process (write-behind applies to it only)."""
        return WorkerOptions(
            write_behind=queue_worker and self.write_behind,
            store_text=self.store_rollout_text,
            lease_ttl_s=self.lease_ttl_s,
            batch_rollouts=self.batch_rollouts,
            name=name,
            heartbeat_s=self.heartbeat_s,
            generate_timeout_s=self.generate_timeout_s,
            unhealthy_after=self.unhealthy_after if queue_worker else 0,
            hands_back_refused=queue_worker,
        )

    def job_kinds(self) -> tuple[JobKind, ...]:
        """Every kind of queue work under the settings' retry policy: what the worker's fail
        path and the dispatcher's lease expiry both read, so they give up at the same count."""
        return with_retry(KINDS, RetryPolicy(self.max_attempts, self.retry_backoff_s))

    def celery_options(self) -> CeleryOptions:
        return CeleryOptions(self.broker_url, self.queue, self.visibility_timeout_s)

    def dispatch_options(self) -> DispatchOptions:
        return DispatchOptions(
            # outlives any wait a cycle can do on a row lock (with a margin), so a dispatcher
            # blocked on one does not lose its lease to a second that then runs beside it
            lock_ttl_s=max(10.0, 5 * self.dispatch_interval_s, 2 * self.db_lock_timeout_s + 10),
            requeue_after_s=self.requeue_after_s,
            lost_grace_s=self.lost_grace_s,
            messages_per_worker=self.messages_per_worker,
            split_tail=self.split_tail,
            worker_live_s=max(30.0, 3 * self.heartbeat_s),
        )
