"""Training runs and their per-step metrics, so training progress is plain SQL too."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint, func
from sqlalchemy.orm import Mapped, mapped_column

from stepq.models.base import Base

RUN_RUNNING = "running"
RUN_DONE = "done"
RUN_FAILED = "failed"


class TrainingRun(Base):
    """One training run (a judge on a snapshot, or DPO/PRM on another signal's dataset);
    resumed in place (same row) after a crash.

    ``output_dir`` identifies the run: starting the same training again continues it from
    its last checkpoint.  ``lease_owner``/``lease_expires_at`` (epoch seconds) say which
    process trains it now, so two processes never write one run's checkpoints.
    """

    __tablename__ = "training_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    snapshot_id: Mapped[int | None] = mapped_column(ForeignKey("snapshots.id"), index=True, nullable=True)
    dataset: Mapped[str | None] = mapped_column(Text, nullable=True)
    """What a run that is not on a snapshot trained on (``preferences:SET``, ``outcomes:SET``
    or a folder)."""
    method: Mapped[str] = mapped_column(String(20))
    lineage: Mapped[str | None] = mapped_column(String(200), nullable=True, index=True)
    recipe: Mapped[str] = mapped_column(Text)
    base_model: Mapped[str] = mapped_column(Text)
    output_dir: Mapped[str] = mapped_column(Text, unique=True)
    status: Mapped[str] = mapped_column(String(20))
    host: Mapped[str] = mapped_column(String(200))
    lease_owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_checkpoint: Mapped[str | None] = mapped_column(Text, nullable=True)
    checkpoints: Mapped[list[str]] = mapped_column(JSON, default=list)
    global_step: Mapped[int] = mapped_column(Integer, default=0)
    max_steps: Mapped[int | None] = mapped_column(Integer, nullable=True)
    resumes: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class TrainingMetric(Base):
    """What the trainer logged at one step; the common metrics as columns, all of them in
    ``values``.  Unique per (run, step): a resumed run that logs a step again overwrites it."""

    __tablename__ = "training_metrics"
    __table_args__ = (UniqueConstraint("run_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("training_runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    accuracy_positive: Mapped[float | None] = mapped_column(Float, nullable=True)
    accuracy_negative: Mapped[float | None] = mapped_column(Float, nullable=True)
    completion_length: Mapped[float | None] = mapped_column(Float, nullable=True)
    clip_ratio: Mapped[float | None] = mapped_column(Float, nullable=True)
    entropy: Mapped[float | None] = mapped_column(Float, nullable=True)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    values: Mapped[dict[str, Any]] = mapped_column(JSON)
    logged_at: Mapped[float] = mapped_column(Float)
