"""Replay a budget's decisions on rollouts already drawn: labels, cost and where they differ.

An exhaustive run holds sample i of every prefix for i < M, and a budget only ever asks for
sample indices below M, so driving ``decide`` against those stored rewards gives the labels
and the cost the budget would have had on the same draws, in seconds instead of a model's
minutes.  ``bench_budget --settings neural`` reports it beside the budget's own run through
the task code: with the same draws on both sides, the replay's agreement change is the
budget's inference alone, without the sampling noise of two independent runs (on 160
trajectories of the weak neural policy, the interval of an independent run's Abs-Q change
was 5 points wide, the replay's 3).  It is also where the neural
setting's budget variants were compared before a run through the task code.

Each adaptive label is also filed by the evidence it rests on (``evidence``): the complete
solution's own outcome, its prefix sampled (a success drawn, or M failures), or inferred
from another prefix (alive because a later prefix is; dead because an earlier one is), so a
loss of agreement can be traced to the inference that caused it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, text

from stepq.models import Database
from stepq.workers.labelling.budget import BudgetPolicy, Observation
from stepq.workers.labelling.labels import LabelRule

Key = tuple[str, int]
"""(trajectory, chunk index from 1): the trajectory is its problem's external id, or with
several trajectories per problem ``external id|source key`` (``trajectory_key``)."""


def trajectory_key(external_id: str, source_key: str, per_trajectory: bool) -> str:
    return f"{external_id}|{source_key}" if per_trajectory else external_id


def problem_of(key: Key) -> str:
    """The problem a label belongs to: the bootstrap resamples problems, since siblings'
    labels rest on shared draws."""
    return key[0].rsplit("|", 1)[0]


@dataclass(frozen=True)
class Pool:
    """One trajectory's stored draws: ``rewards[k][i]`` and ``tokens[k][i]`` of sample i of prefix k."""

    n_chunks: int
    outcome: bool
    rewards: dict[int, dict[int, int]]
    tokens: dict[int, dict[int, int]]
    chunk_sizes: tuple[int, ...] = ()
    trajectory_id: int = 0
    siblings: tuple[tuple[int, bool], ...] = ()
    """As the task code reads them (``sibling_samples``): (chunks shared, outcome) per sibling."""


def load_pools(db: Database, set_name: str | None = None, per_trajectory: bool = False) -> dict[str, Pool]:
    """Every trajectory's rollouts in an annotated set (the database's only set when None), by
    ``trajectory_key``: its problem's external id, with ``per_trajectory`` its source key too
    (a set with several trajectories per problem)."""
    from stepq.models.rollout_queries import sibling_samples
    from stepq.models.trajectories import Chunk

    where = "" if set_name is None else " JOIN problem_sets s ON s.id = p.problem_set_id WHERE s.name = :n"
    args = {} if set_name is None else {"n": set_name}
    with db.engine.connect() as conn:
        shapes = conn.execute(
            text(
                "SELECT p.external_id, t.source_key, t.id, t.n_chunks, t.outcome FROM trajectories t "
                "JOIN problems p ON p.id = t.problem_id" + where
            ),
            args,
        ).all()
        keys = {tid: trajectory_key(ext, src, per_trajectory) for ext, src, tid, _, _ in shapes}
        if len(set(keys.values())) < len(keys):
            raise ValueError("several trajectories per problem: load the pools with per_trajectory=True")
        rows = conn.execute(
            text(
                "SELECT t.id, r.prefix_len, r.sample_idx, r.reward, r.tokens FROM rollouts r "
                "JOIN trajectories t ON t.id = r.trajectory_id JOIN problems p ON p.id = t.problem_id" + where
            ),
            args,
        ).all()
    with db.session() as session:
        chunks: dict[int, list[Chunk]] = {tid: [] for tid in keys}
        for chunk in session.scalars(select(Chunk).where(Chunk.trajectory_id.in_(list(keys))).order_by(Chunk.idx)):
            chunks[chunk.trajectory_id].append(chunk)
        siblings = sibling_samples(session, chunks)
        sizes = {tid: tuple(len(c.text) for c in part) for tid, part in chunks.items()}
    pools = {
        keys[tid]: Pool(int(n), bool(outcome), {}, {}, sizes[tid], tid, siblings.get(tid, ()))
        for _, _, tid, n, outcome in shapes
    }
    for tid, k, i, reward, tokens in rows:
        pools[keys[tid]].rewards.setdefault(k, {})[i] = int(reward)
        pools[keys[tid]].tokens.setdefault(k, {})[i] = int(tokens)
    return pools


@dataclass
class Replay:
    labels: dict[Key, bool]
    evidence: dict[Key, str]
    rollouts: int
    tokens: int


def replay(pools: dict[str, Pool], budget: BudgetPolicy, rule: LabelRule, m: int) -> Replay:
    """Drive ``budget`` against the stored draws until every trajectory is done."""
    out = Replay({}, {}, 0, 0)
    for ext, pool in pools.items():
        seen: dict[int, dict[int, int]] = {}
        while True:
            obs = Observation(
                pool.n_chunks,
                m,
                pool.outcome,
                seen,
                budget.counts_trajectory(),
                key=str(pool.trajectory_id) if pool.trajectory_id else ext,
                chunk_sizes=pool.chunk_sizes,
                siblings=pool.siblings,
            )
            decision = budget.decide(obs, rule)
            if decision.done:
                break
            for k, indices in decision.requests.items():
                for i in indices:
                    if i not in pool.rewards.get(k, {}):
                        raise ValueError(f"the stored run has no sample {i} of prefix {k} of {ext}")
                    seen.setdefault(k, {})[i] = pool.rewards[k][i]
                    out.tokens += pool.tokens[k][i]
                    out.rollouts += 1
        for idx, label in enumerate(decision.labels, start=1):
            assert label is not None, f"{ext} chunk {idx} left undecided"
            out.labels[(ext, idx)] = label
            out.evidence[(ext, idx)] = evidence(obs, idx, label)
    return out


def evidence(obs: Observation, k: int, label: bool) -> str:
    """What an Abs-Q-style label of prefix ``k`` rests on."""
    if k == obs.n_chunks:
        return "outcome"
    drawn = obs.rewards.get(k, {})
    t = int(obs.trajectory_is_sample)
    shared = [outcome for length, outcome in obs.siblings if length >= k][: obs.m - t] if t else []
    if any(drawn.values()) or any(shared):
        return "sampled alive"  # a sibling that shares prefix k continued it as a rollout would
    if not label and len(drawn) + t + len(shared) >= obs.m:
        return "sampled dead"
    return "inferred alive" if label else "inferred dead"


def by_evidence(result: Replay, exhaustive: dict[Key, bool], reference: dict[Key, bool]) -> dict[str, dict[str, Any]]:
    """Per kind of evidence: chunks, and how often the budget and exhaustive M agree with the
    reference on them (the disagreements a change of the budget can win back)."""
    chunks = Counter(result.evidence.values())
    out: dict[str, dict[str, Any]] = {}
    for kind, n in sorted(chunks.items()):
        keys = [key for key, e in result.evidence.items() if e == kind]
        out[kind] = {
            "chunks": n,
            "budget_agrees": sum(result.labels[key] == reference[key] for key in keys),
            "exhaustive_agrees": sum(exhaustive[key] == reference[key] for key in keys),
        }
    return out


def change_interval(
    got: dict[Key, bool], base: dict[Key, bool], want: dict[Key, bool], draws: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95% bootstrap interval, over problems (a problem's trajectories together), of how many
    points more often ``got`` agrees with ``want`` than ``base`` does."""
    import random

    per: dict[str, list[int]] = {}
    for key, label in want.items():
        row = per.setdefault(problem_of(key), [0, 0, 0])
        row[0] += got.get(key) == label
        row[1] += base.get(key) == label
        row[2] += 1
    rows = list(per.values())
    rng = random.Random(seed)
    changes = []
    for _ in range(draws):
        sample = [rows[rng.randrange(len(rows))] for _ in rows]
        total = sum(r[2] for r in sample)
        changes.append(100 * (sum(r[0] for r in sample) - sum(r[1] for r in sample)) / total)
    changes.sort()
    return round(changes[int(0.025 * draws)], 2), round(changes[int(0.975 * draws) - 1], 2)


def dead_stays_dead(pools: dict[str, Pool], m: int) -> dict[str, int]:
    """How often the assumption the adaptive budget checks fails in a complete run: prefixes
    with no success in their M samples, and how many of them a later prefix of the same
    trajectory (or the trajectory's own correct answer) shows could still be finished."""
    dead = revived = 0
    for pool in pools.values():
        for k in range(pool.n_chunks):
            drawn = pool.rewards.get(k, {})
            if len(drawn) < m or any(drawn.values()):
                continue
            dead += 1
            later = (any(pool.rewards.get(j, {}).values()) for j in range(k + 1, pool.n_chunks))
            revived += pool.outcome or any(later)
    return {"dead_prefixes": dead, "a_later_prefix_succeeds": revived}
