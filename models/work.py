"""Scheduling state: one work item per trajectory with a database lease, named locks,
and the workers that hold leases."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, func
from sqlalchemy.orm import Mapped, mapped_column

from stepq.models.base import Base
from stepq.models.jobs import JobTable, LeasedJob


class RolloutWork(LeasedJob, Base):
    """The rollouts a trajectory still needs, as one job of the queue (``jobs``).

    The broker only carries ``id``; everything else (what is missing, who holds it, until
    when) is here, so losing the broker loses no work.
    """

    __tablename__ = "rollout_work"
    __table_args__ = (
        Index("ix_rollout_work_state", "state"),
        Index("ix_rollout_work_state_id", "state", "id"),
        Index("ix_rollout_work_state_lease", "state", "lease_expires_at"),
        Index("ix_rollout_work_state_enqueued", "state", "enqueued_at"),
        Index("ix_rollout_work_retry_at", "retry_at"),
        Index("ix_rollout_work_dispatch", "problem_set_id", "state", "dispatch_key", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trajectory_id: Mapped[int] = mapped_column(ForeignKey("trajectories.id", ondelete="CASCADE"), unique=True)
    target_m: Mapped[int] = mapped_column(Integer)
    trajectory_is_sample: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    """Whether the budget counts the trajectory as one of its own prefixes' samples."""
    problem_set_id: Mapped[int] = mapped_column(Integer)
    """The trajectory's set, kept on the job so each set's next jobs are one index range (no
    foreign key of its own: the trajectory's already removes the row with its set)."""
    planned_at: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    priority: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    """The set's strategy's score for this trajectory, in [0, 1] (0 under ``fifo``)."""
    dispatch_key: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    """Lowest first within a set: ``planned_at - priority * aging``.  Aging bounds the wait
    (work planned ``aging`` seconds earlier goes first whatever the priorities), so no
    problem starves behind a stream of new high-priority work."""
    priority_round_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The ``priority_rounds`` row (strategy and judge) that set ``priority``; None: never
    scored.  A plain integer: rounds are history, kept while the work is."""


ROLLOUT_WORK = JobTable(
    "rollouts",
    RolloutWork,
    set_of=lambda: RolloutWork.problem_set_id,
    in_set=lambda set_id: RolloutWork.problem_set_id == set_id,
    dispatch_order=lambda: (RolloutWork.problem_set_id, RolloutWork.dispatch_key),
)


class Lock(Base):
    """A named lease (e.g. ``dispatcher``) so only one process acts at a time (``leases``)."""

    __tablename__ = "locks"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    lease_owner: Mapped[str] = mapped_column(String(200))
    lease_expires_at: Mapped[float] = mapped_column(Float)
    acquired_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """When its holder took it (a renewal keeps it): "a dispatcher since 09:12"."""


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
    unhealthy: Mapped[str | None] = mapped_column(Text, nullable=True)
    """Why the process stopped taking work (the jobs it ran failed, one after another); None: healthy."""
    refused: Mapped[str | None] = mapped_column(Text, nullable=True)
    """The latest work it refused, and why (a set whose rollouts another generator draws)."""
