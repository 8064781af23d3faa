"""Trajectories (policy solutions) and their chunks."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import Mapped, mapped_column

from stepq.models.base import Base


class Trajectory(Base):
    """One solution of a problem, exactly as the policy wrote it.

    ``prompt`` is the policy prompt as the policy saw it and ``text`` the assistant
    text; rollouts continue from ``prompt + text[:end of chunk k]`` byte for byte.
    """

    __tablename__ = "trajectories"
    __table_args__ = (UniqueConstraint("problem_id", "source_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id", ondelete="CASCADE"), index=True)
    source_key: Mapped[str] = mapped_column(String(200))
    prompt: Mapped[str] = mapped_column(Text)
    text: Mapped[str] = mapped_column(Text)
    final_answer: Mapped[str | None] = mapped_column(Text, nullable=True)
    outcome: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    n_chunks: Mapped[int] = mapped_column(Integer)
    segmentation: Mapped[str] = mapped_column(String(40))
    generator: Mapped[str] = mapped_column(String(200))
    seed: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


GIVEN_STEPS = "given-steps"
"""A trajectory's segmentation when its steps came with the data (an ingested ProcessBench or
PRM800K file): the steps are the data, so nothing re-cuts them without being told."""


class Chunk(Base):
    """Step ``idx`` (1-based) of a trajectory; joined in order the chunks give ``text``.

    ``ground_truth`` is known only for synthetic or benchmark data: True when this chunk
    and every chunk before it are error-free.
    """

    __tablename__ = "chunks"
    __table_args__ = (UniqueConstraint("trajectory_id", "idx"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trajectory_id: Mapped[int] = mapped_column(ForeignKey("trajectories.id", ondelete="CASCADE"))
    idx: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    ground_truth: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
