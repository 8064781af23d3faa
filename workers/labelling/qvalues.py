"""From rollout counts to Q-values and labels (pure), and applying them to one trajectory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from stepq.models import Database, queries
from stepq.models.trajectories import Chunk, Trajectory
from stepq.workers.labelling.budget import BudgetPolicy, Decision, Observation, parse_budget
from stepq.workers.labelling.labels import LabelRule


@dataclass(frozen=True)
class QEstimate:
    prefix_len: int
    n_samples: int
    n_correct: int
    source: str  # rollouts | outcome

    @property
    def q(self) -> float:
        return self.n_correct / self.n_samples if self.n_samples else 0.0


def estimates(stats: Mapping[int, tuple[int, int]], n_chunks: int, outcome: bool | None) -> list[QEstimate]:
    """Q(0..n-1) from (samples, successes) per prefix, and Q(n) from the outcome."""
    out = [QEstimate(k, n, c, "rollouts") for k, (n, c) in sorted(stats.items()) if k < n_chunks]
    out.append(QEstimate(n_chunks, 1, int(bool(outcome)), "outcome"))
    return out


def rollout_counts(rewards: Mapping[int, Mapping[int, int]], m: int) -> dict[int, tuple[int, int]]:
    """prefix -> (samples, successes) over sample indices below m."""
    out = {}
    for k, samples in rewards.items():
        kept = [r for i, r in samples.items() if i < m]
        out[k] = (len(kept), sum(kept))
    return out


class TrajectoryLabeller:
    """Keeps one trajectory's Q-values and labels in step with its rollout rows.

    ``refresh`` runs in the same transaction as the rollout writes and reads the rows back
    (another worker may have written some too), so the stored Q-values always agree with
    the rows they summarise; it returns the budget policy's decision: what to sample next.
    """

    def __init__(
        self,
        traj: Trajectory,
        chunks: list[Chunk],
        m: int,
        policy: BudgetPolicy,
        rule: LabelRule,
        trajectory_is_sample: bool,
        siblings: tuple[tuple[int, bool], ...] = (),
    ) -> None:
        self.traj, self.chunks, self.m = traj, chunks, m
        self.policy, self.rule = policy, rule
        self.trajectory_is_sample = trajectory_is_sample
        self.siblings = siblings
        self.chunk_sizes = tuple(len(c.text) for c in chunks)  # read once, not every round

    def decide(self, rewards: Mapping[int, Mapping[int, int]]) -> Decision:
        obs = Observation(
            self.traj.n_chunks,
            self.m,
            bool(self.traj.outcome),
            rewards,
            self.trajectory_is_sample,
            str(self.traj.id),
            self.chunk_sizes,
            self.siblings,
        )
        return self.policy.decide(obs, self.rule)

    def refresh(self, session: Session) -> Decision:
        return self.store(session, queries.rollout_rewards(session, self.traj.id))

    def store(self, session: Session, rewards: Mapping[int, Mapping[int, int]]) -> Decision:
        """Write Q-values and the decided labels for ``rewards`` (all of the trajectory's)."""
        ests = estimates(rollout_counts(rewards, self.m), self.traj.n_chunks, self.traj.outcome)
        queries.upsert_q_values(
            session,
            [
                {
                    "trajectory_id": self.traj.id,
                    "prefix_len": e.prefix_len,
                    "n_samples": e.n_samples,
                    "n_correct": e.n_correct,
                    "q": e.q,
                    "source": e.source,
                }
                for e in ests
            ],
        )
        decision = self.decide(rewards)
        rows: list[dict[str, Any]] = []
        for chunk, label in zip(self.chunks, decision.labels, strict=True):
            if label is None:
                continue
            before, after = decision.q[chunk.idx - 1], decision.q[chunk.idx]
            rows.append(
                {
                    "chunk_id": chunk.id,
                    "rule": self.rule.key,
                    "positive": label,
                    "q_before": -1.0 if before is None else before,
                    "q_after": -1.0 if after is None else after,
                }
            )
        queries.upsert_labels(session, rows)
        return decision


RELABEL_BATCH = 200
"""Trajectories relabelled a transaction."""


@dataclass(frozen=True)
class RelabelReport:
    labelled: int
    undecided: int


def relabel_set(db: Database, set_name: str, rule: LabelRule, *, make_default: bool = False) -> RelabelReport:
    """Labels for ``rule`` from stored rollouts, without sampling; chunks whose label the
    set's budget has not sampled enough for (adaptive) are counted as undecided."""
    with db.session() as s:
        pset = queries.get_set(s, set_name)
        if make_default:
            pset.label_rule = rule.key
        policy = parse_budget(pset.budget_policy)
        m = pset.rollouts_per_prefix
        tids = queries.set_trajectory_ids(s, pset.id)
    return relabel_trajectories(db, tids, m, policy, [rule])


def relabel_trajectories(
    db: Database,
    trajectory_ids: Sequence[int],
    m: int,
    policy: BudgetPolicy,
    rules: Sequence[LabelRule],
    *,
    reopen: bool = False,
) -> RelabelReport:
    """The one relabel loop (a new rule, re-graded rollouts): each trajectory's Q-values and
    its labels under each rule recomputed from its stored rollouts, a few hundred trajectories
    a transaction; ``reopen``: their work items reopen too, so an adaptive budget can sample
    what the changed evidence now asks for."""
    labelled = undecided = 0
    for start in range(0, len(trajectory_ids), RELABEL_BATCH):
        part = list(trajectory_ids[start : start + RELABEL_BATCH])
        with db.session() as s:
            for tid in part:
                ctx = queries.load_work_context(s, tid)
                is_sample = queries.trajectory_counted(s, tid)
                for rule in rules:
                    labeller = TrajectoryLabeller(ctx.trajectory, ctx.chunks, m, policy, rule, is_sample, ctx.siblings)
                    decision = labeller.store(s, ctx.rewards)
                    labelled += sum(label is not None for label in decision.labels)
                    undecided += sum(label is None for label in decision.labels)
            if reopen:
                queries.reopen_trajectories(s, part)
    return RelabelReport(labelled, undecided)
