"""Scheduling state: one work item per trajectory with a database lease, named locks,
and the workers that hold leases."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, false, func
from sqlalchemy.orm import Mapped, mapped_column

from stepq.models.base import Base

PENDING = "pending"
QUEUED = "queued"
RUNNING = "running"
DONE = "done"
FAILED = "failed"


class RolloutWork(Base):
    """The rollouts a trajectory still needs, as one schedulable unit.

    The broker only carries ``id``; everything else (what is missing, who holds it, until
    when) is here, so losing the broker loses no work.  Lease times are epoch seconds.
    """

    __tablename__ = "rollout_work"
    __table_args__ = (
        Index("ix_rollout_work_state", "state"),
        Index("ix_rollout_work_state_id", "state", "id"),
        Index("ix_rollout_work_state_lease", "state", "lease_expires_at"),
        Index("ix_rollout_work_state_enqueued", "state", "enqueued_at"),
        Index("ix_rollout_work_retry_at", "retry_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trajectory_id: Mapped[int] = mapped_column(ForeignKey("trajectories.id", ondelete="CASCADE"), unique=True)
    target_m: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(20), default=PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    enqueue_count: Mapped[int] = mapped_column(Integer, default=0)
    enqueued_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    trajectory_is_sample: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    """Whether the budget counts the trajectory as one of its own prefixes' samples."""
    retry_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """A transient failure's backoff: the item is not published again before this moment."""
    rerun: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """The set's settings changed while the item ran: it goes back to pending, not done."""


class Lock(Base):
    """A named lease (e.g. ``dispatcher``) so only one process acts at a time."""

    __tablename__ = "locks"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[float] = mapped_column(Float)


class Worker(Base):
    """A worker process: heartbeat and running totals, for operators and the dispatcher
    (which sizes the broker queue by the live workers)."""

    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    backend: Mapped[str] = mapped_column(String(200))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    last_heartbeat: Mapped[float] = mapped_column(Float)
    rollouts_done: Mapped[int] = mapped_column(Integer, default=0)
    tokens_done: Mapped[int] = mapped_column(Integer, default=0)
    busy_items: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Work items the process holds right now (0: idle), written by its heartbeat."""
    label: Mapped[str] = mapped_column(String(200), default="", server_default="")
    """The operator's ``--name`` (several processes may share it; ``name`` is unique)."""
    stopped_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    engine_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    """Seconds the process spent inside ``generate`` calls."""
    grades: Mapped[dict[str, int] | None] = mapped_column(JSON, nullable=True)
    """Rollouts graded by this process, per grading method."""
