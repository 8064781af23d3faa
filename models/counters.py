"""Per-set progress counters, kept exact by PostgreSQL triggers in the writing transactions.

At StepWiser's scale (~55M rollouts) counting rows on every ``stepq status`` would scan the
rollout table.  Instead, statement-level triggers (migration 0006) add each statement's
deltas to these rows, in the same transaction as the write, so the counters are exactly
what the tables hold.  Rows are sharded by the writing backend (``pg_backend_pid() % 8``),
so concurrent workers do not queue on one row; readers sum the shards.  SQLite, the
embedded default for small runs, has no triggers here: there status reads the
``annotation_progress`` view directly.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, Index, Integer, SmallInteger, String
from sqlalchemy.orm import Mapped, mapped_column

from stepq.models.base import Base


class SetCounters(Base):
    """One shard of a set's counts; a set's value is the sum over its shards."""

    __tablename__ = "set_counters"

    problem_set_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    shard: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    problems: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    trajectories: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    chunks: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    rollouts: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    work_pending: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    work_queued: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    work_running: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    work_done: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    work_failed: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    chunks_done: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """Chunks of trajectories whose work is done (what an exhaustive budget would sample)."""
    rollouts_done: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """Rollouts of trajectories whose work is done (what was sampled for them)."""
    tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """Tokens generated for the set's rollouts (migration 0014): what GPU time is paid in."""
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """Tokens of the contexts those rollouts continued, where the engine reported them (0015)."""


class LabelCounters(Base):
    """One shard of a set's label counts under one rule."""

    __tablename__ = "label_counters"

    problem_set_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rule: Mapped[str] = mapped_column(String(100), primary_key=True)
    shard: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    labelled: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    positive: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class EventCount(Base):
    """A running total of something that happens (lease expiries, failed items, lost
    messages, retries): what the dispatcher and workers saw, for metrics."""

    __tablename__ = "event_counts"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class ProgressSample(Base):
    """A set's progress at one moment, written by the dispatcher every few seconds.

    Rates and ETAs come from two samples and the real time between them (not from a
    fixed window), and the series is a run's progress over time, for plots and dashboards.
    """

    __tablename__ = "progress_samples"
    __table_args__ = (Index("ix_progress_samples_set_at", "problem_set_id", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    problem_set_id: Mapped[int] = mapped_column(Integer)
    at: Mapped[float] = mapped_column(Float)
    rollouts: Mapped[int] = mapped_column(BigInteger)
    trajectories_done: Mapped[int] = mapped_column(BigInteger)
    labelled_chunks: Mapped[int] = mapped_column(BigInteger)
