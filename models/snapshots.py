"""Snapshots: immutable, numbered, balanced sets of labelled chunks for judge training.

A snapshot row stores the label *value* and the Q-values it came from, never a pointer to
``chunk_labels``: relabelling, more annotation or a new rule never changes a snapshot.  The
text it was labelled on is kept too (``SnapshotText``: the question and every chunk of each
trajectory, as they were when the snapshot was made), so a question updated by ``stepq
ingest --update`` or a re-segmented trajectory changes nothing a snapshot exports.  Its
``chunk_id`` and ``trajectory_id`` say where a row came from; they are not foreign keys, so
the rows outlive what they came from.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, func
from sqlalchemy.orm import Mapped, mapped_column

from stepq.models.base import Base

TRAIN = "train"
VALIDATION = "validation"


class Snapshot(Base):
    """One frozen training set; ``manifest`` says how to rebuild it and what it holds."""

    __tablename__ = "snapshots"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    lineage: Mapped[str | None] = mapped_column(String(200), nullable=True, index=True)
    """The trainer service's lineage that made it (None for snapshots made by hand)."""
    rule: Mapped[str] = mapped_column(String(100))
    seed: Mapped[int] = mapped_column(Integer)
    val_fraction: Mapped[float] = mapped_column(Float)
    balanced: Mapped[bool] = mapped_column(Boolean)
    content_hash: Mapped[str] = mapped_column(String(64))
    manifest: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class SnapshotRow(Base):
    """One labelled chunk in one split of a snapshot."""

    __tablename__ = "snapshot_rows"
    __table_args__ = (
        UniqueConstraint("snapshot_id", "chunk_id"),
        Index("ix_snapshot_rows_snapshot_id_split", "snapshot_id", "split"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    snapshot_id: Mapped[int] = mapped_column(ForeignKey("snapshots.id", ondelete="CASCADE"))
    split: Mapped[str] = mapped_column(String(20))
    chunk_id: Mapped[int] = mapped_column(Integer)
    trajectory_id: Mapped[int] = mapped_column(Integer)
    problem_id: Mapped[int] = mapped_column(Integer)
    chunk_idx: Mapped[int] = mapped_column(Integer)
    positive: Mapped[bool] = mapped_column(Boolean)
    q_before: Mapped[float] = mapped_column(Float)
    q_after: Mapped[float] = mapped_column(Float)


class SnapshotText(Base):
    """The text a snapshot's trajectory was labelled on: its question and chunks, frozen."""

    __tablename__ = "snapshot_texts"

    snapshot_id: Mapped[int] = mapped_column(ForeignKey("snapshots.id", ondelete="CASCADE"), primary_key=True)
    trajectory_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    question: Mapped[str] = mapped_column(Text)
    chunks: Mapped[list[str]] = mapped_column(JSON)
