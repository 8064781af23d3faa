"""Step search: one search per (search name, problem), its turns, and the step preference
pairs they yield.

A search is a job of the queue (``jobs``), like a trajectory's rollouts: the broker only
carries its id.  Each turn is written once (unique per search and turn number) in the same
transaction that checks the lease, so a crashed worker's search resumes at its next turn
and no pair is ever written twice.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, func
from sqlalchemy.orm import Mapped, mapped_column

from stepq.models.base import Base
from stepq.models.jobs import JobTable, LeasedJob

ADVANCE = "advance"
FINISH = "finish"
ROLLBACK = "rollback"
RESAMPLE = "resample"
"""All candidates tied with nothing to roll back to: sample again from the same prefix."""


class StepSearch(LeasedJob, Base):
    __tablename__ = "step_searches"
    __table_args__ = (
        UniqueConstraint("name", "problem_id"),
        Index("ix_step_searches_state", "state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    problem_set_id: Mapped[int] = mapped_column(ForeignKey("problem_sets.id", ondelete="CASCADE"), index=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id", ondelete="CASCADE"))
    prompt: Mapped[str] = mapped_column(Text)
    """The policy prompt; the steps kept so far are appended to it as a raw completion."""
    width: Mapped[int] = mapped_column(Integer)
    max_turns: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(Integer)
    judge_backend: Mapped[str] = mapped_column(String(40))
    judge_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    scoring: Mapped[str] = mapped_column(String(20), server_default="both-orders")
    """How a candidate's score counts the judge's verdicts (``pairwise.SCORINGS``); the server
    default is what searches from before the column did."""
    policy_model: Mapped[str | None] = mapped_column(Text, nullable=True)
    """The policy, when not the set's own model: a round of the method's loop searches with
    the model the previous round trained (on the set's backend)."""
    policy_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("training_runs.id", ondelete="SET NULL"), nullable=True, index=True
    )
    """The training run that produced the policy and judge of this search (a round k+1)."""
    segmentation: Mapped[str | None] = mapped_column(String(40), nullable=True)
    """How a candidate is cut to one step: the segmentation method of the set's trajectories
    (``segmentation.SPLITTERS``), so a turn is one step of the policy; NULL (searches started
    before the column): at the first blank line."""
    sampling: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """Sampling of the candidates, over the set's own (``max_tokens``, ``stop``); NULL
    (searches started before the column): the set's own."""
    outcome: Mapped[str | None] = mapped_column(String(20), nullable=True)
    """``finished`` (a final answer was kept) or ``exhausted`` (``max_turns`` reached)."""
    updated_at: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


STEP_SEARCHES = JobTable(
    "searches",
    StepSearch,
    set_of=lambda: StepSearch.problem_set_id,
    in_set=lambda set_id: StepSearch.problem_set_id == set_id,
)


class SearchTurn(Base):
    """One turn: the candidates sampled from the current prefix, their pairwise wins, what
    the search did, and (for advance/finish) the (best, worst) preference pair."""

    __tablename__ = "search_turns"
    __table_args__ = (UniqueConstraint("search_id", "turn"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    search_id: Mapped[int] = mapped_column(ForeignKey("step_searches.id", ondelete="CASCADE"))
    turn: Mapped[int] = mapped_column(Integer)
    prefix: Mapped[list[str]] = mapped_column(JSON)
    candidates: Mapped[list[str]] = mapped_column(JSON)
    wins: Mapped[list[int]] = mapped_column(JSON)
    consistent_pairs: Mapped[int] = mapped_column(Integer)
    unanswered: Mapped[int] = mapped_column(Integer, server_default="0", default=0)
    """The judge's answers with no verdict (cut at its token limit): they count for neither side."""
    action: Mapped[str] = mapped_column(String(20))
    chosen: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rejected: Mapped[int | None] = mapped_column(Integer, nullable=True)
    worker: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[float] = mapped_column(Float)
