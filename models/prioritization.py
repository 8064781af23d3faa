"""Active learning's records: which judge ordered which work, and the scoring jobs that do it.

A *priority round* is one ordering of a set's waiting trajectories: a strategy, the judge
(a training run) it asked, and what the set had spent and labelled when the round began, so
an operator can ask in SQL what each round cost and bought.  Scoring the waiting
trajectories with the round's judge is queue work (``PriorityScoring``: a range of the set's
rollout work ids, batched, leased, resumable like any job); each scored job's
``RolloutWork.priority_round_id`` says which round placed it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from stepq.models.base import Base
from stepq.models.jobs import JobTable, LeasedJob


class PriorityRound(Base):
    __tablename__ = "priority_rounds"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    problem_set_id: Mapped[int] = mapped_column(ForeignKey("problem_sets.id", ondelete="CASCADE"), index=True)
    strategy: Mapped[str] = mapped_column(String(200))
    """The set's ``priority_strategy`` when the round began (its judge included)."""
    judge_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("training_runs.id", ondelete="SET NULL"), nullable=True, index=True
    )
    """The training run whose judge scored this round (None: ``random`` needs none)."""
    created_at: Mapped[float] = mapped_column(Float)
    rollouts_before: Mapped[int] = mapped_column(Integer, default=0)
    """Rollouts the set had when the round began: a round's cost is the next round's value
    minus this."""
    labelled_before: Mapped[int] = mapped_column(Integer, default=0)
    """Chunks labelled under the set's rule when the round began."""
    covered_to_id: Mapped[int] = mapped_column(Integer, default=0)
    """Rollout work ids up to this one have a scoring job; work planned later gets one from
    the dispatcher's next cycle, so new problems are scored by the same judge."""
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class PriorityScoring(LeasedJob, Base):
    """Score one range of a set's waiting trajectories with a round's judge and write their
    priorities.  Rerunning it is harmless: it writes the same priorities, and never over a
    later round's."""

    __tablename__ = "priority_scorings"
    __table_args__ = (Index("ix_priority_scorings_state_id", "state", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("priority_rounds.id", ondelete="CASCADE"), index=True)
    problem_set_id: Mapped[int] = mapped_column(ForeignKey("problem_sets.id", ondelete="CASCADE"), index=True)
    work_from_id: Mapped[int] = mapped_column(Integer)
    """The rollout work ids this job scores: ``work_from_id < id <= work_to_id``."""
    work_to_id: Mapped[int] = mapped_column(Integer)
    scored: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """How many waiting trajectories it scored (set when done)."""
    updated_at: Mapped[float] = mapped_column(Float, default=0.0)


PRIORITY_SCORINGS = JobTable(
    "scorings",
    PriorityScoring,
    set_of=lambda: PriorityScoring.problem_set_id,
    in_set=lambda set_id: PriorityScoring.problem_set_id == set_id,
)
