"""Scheduling state: one work item per trajectory with a database lease, named locks,
and the workers that hold leases."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, func, select
from sqlalchemy.orm import Mapped, mapped_column

from stepq.models.base import Base
from stepq.models.jobs import JobTable, LeasedJob
from stepq.models.problems import Problem
from stepq.models.trajectories import Trajectory


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
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trajectory_id: Mapped[int] = mapped_column(ForeignKey("trajectories.id", ondelete="CASCADE"), unique=True)
    target_m: Mapped[int] = mapped_column(Integer)
    trajectory_is_sample: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    """Whether the budget counts the trajectory as one of its own prefixes' samples."""


def _trajectories_of(set_id: int) -> Any:
    return (
        select(Trajectory.id).join(Problem, Problem.id == Trajectory.problem_id).where(Problem.problem_set_id == set_id)
    )


ROLLOUT_WORK = JobTable(
    "rollouts",
    RolloutWork,
    set_of=lambda: (
        select(Problem.problem_set_id)
        .join(Trajectory, Trajectory.problem_id == Problem.id)
        .where(Trajectory.id == RolloutWork.trajectory_id)
        .correlate(RolloutWork)
        .scalar_subquery()
    ),
    in_set=lambda set_id: RolloutWork.trajectory_id.in_(_trajectories_of(set_id)),
)


class Lock(Base):
    """A named lease (e.g. ``dispatcher``) so only one process acts at a time (``leases``)."""

    __tablename__ = "locks"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    lease_owner: Mapped[str] = mapped_column(String(200))
    lease_expires_at: Mapped[float] = mapped_column(Float)


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
