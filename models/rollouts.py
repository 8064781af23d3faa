"""Rollouts, the Q-values computed from them, and chunk labels."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import Mapped, mapped_column

from stepq.models.base import Base


class Rollout(Base):
    """One graded continuation from prefix ``prefix_len`` of a trajectory.

    Unique on (trajectory, prefix, sample index): a task delivered twice writes once.
    """

    __tablename__ = "rollouts"
    __table_args__ = (
        UniqueConstraint("trajectory_id", "prefix_len", "sample_idx"),
        Index("ix_rollouts_created_at", "created_at"),
        Index("ix_rollouts_grade_method", "grade_method"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trajectory_id: Mapped[int] = mapped_column(ForeignKey("trajectories.id", ondelete="CASCADE"))
    prefix_len: Mapped[int] = mapped_column(Integer)
    sample_idx: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    final_answer: Mapped[str | None] = mapped_column(Text, nullable=True)
    reward: Mapped[int] = mapped_column(SmallInteger)
    grade_method: Mapped[str | None] = mapped_column(String(20), nullable=True)
    """How the reward was decided (exact, numeric, math-verify, timeout, error, no-answer)."""
    tokens: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """Tokens of the context it continued, where the engine reports them."""
    generator: Mapped[str] = mapped_column(String(200))
    worker: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class QValue(Base):
    """Q(k): mean reward of the rollouts from prefix k; a cache recomputable from rollouts.

    Q(n) comes from the trajectory's own outcome (``source = 'outcome'``, no samples).
    """

    __tablename__ = "q_values"
    __table_args__ = (UniqueConstraint("trajectory_id", "prefix_len"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trajectory_id: Mapped[int] = mapped_column(ForeignKey("trajectories.id", ondelete="CASCADE"))
    prefix_len: Mapped[int] = mapped_column(Integer)
    n_samples: Mapped[int] = mapped_column(Integer)
    n_correct: Mapped[int] = mapped_column(Integer)
    q: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(20))


class ChunkLabel(Base):
    """A chunk's label under one rule with its parameters (``rule`` is canonical text)."""

    __tablename__ = "chunk_labels"
    __table_args__ = (UniqueConstraint("chunk_id", "rule"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    chunk_id: Mapped[int] = mapped_column(ForeignKey("chunks.id", ondelete="CASCADE"))
    rule: Mapped[str] = mapped_column(String(100))
    positive: Mapped[bool] = mapped_column(Boolean)
    q_before: Mapped[float] = mapped_column(Float)
    q_after: Mapped[float] = mapped_column(Float)
