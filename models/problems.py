"""Problem sets (with their annotation config) and problems."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    func,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column

from stepq.models.base import Base


class ProblemSet(Base):
    """A named batch of problems and how to annotate it.

    The annotation config lives on the set so that workers anywhere read the same
    settings from the database instead of from their own command lines.
    """

    __tablename__ = "problem_sets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    rollouts_per_prefix: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    label_rule: Mapped[str] = mapped_column(String(100), default="abs-q", server_default="abs-q")
    budget_policy: Mapped[str] = mapped_column(String(200), default="exhaustive", server_default="exhaustive")
    backend: Mapped[str] = mapped_column(String(40), default="synthetic", server_default="synthetic")
    backend_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    sampling: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    seed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    paused: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """A paused set is not dispatched; its running items finish their current batch."""
    needs_planning: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    """New trajectories (or exclusions) since the dispatcher last planned this set: the
    dispatcher plans only flagged sets, so its cycle does not scan every trajectory."""
    priority_strategy: Mapped[str] = mapped_column(String(200), default="fifo", server_default="fifo")
    """In what order the set's trajectories get their rollouts (``stepq annotate --priority``,
    ``workers/priority/strategies.py``): fifo, random, uncertainty or convincing-wrong, with
    the judge behind it (e.g. ``uncertainty:run=3``, ``convincing-wrong:lineage=judge``)."""
    priority_aging_s: Mapped[float] = mapped_column(Float, default=86400.0, server_default="86400")
    """How far a priority of 1 moves work ahead of work planned later (``RolloutWork.dispatch_key``)."""
    sampling_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """How many times the set was resampled (``annotate --resample``): a worker writes a batch
    only while the generation it loaded is still the set's (``queries.fence_write``), so
    nothing sampled the old way survives a resample."""
    generator: Mapped[str | None] = mapped_column(String(400), nullable=True)
    """Who draws the set's rollouts (backend, model and sampling: ``generator_id``), pinned by
    the first batch written (None: none yet, or resampled since): a worker that generates
    otherwise refuses the set's work, so no set is labelled by two models."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Problem(Base):
    """Question text plus reference answer; ``external_id`` makes re-ingestion a no-op."""

    __tablename__ = "problems"
    __table_args__ = (UniqueConstraint("problem_set_id", "external_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    problem_set_id: Mapped[int] = mapped_column(ForeignKey("problem_sets.id", ondelete="CASCADE"), index=True)
    external_id: Mapped[str] = mapped_column(String(200))
    question: Mapped[str] = mapped_column(Text)
    reference_answer: Mapped[str] = mapped_column(Text)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    excluded: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Left out of annotation (e.g. by the prompt filter: all samples right or all wrong)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
