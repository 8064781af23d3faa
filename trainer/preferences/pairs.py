"""Preference pairs from stored Q-values, without a judge (pure).

Two trajectories of a problem that share their first k chunks give two candidate next steps
from the same prefix, each with its Monte Carlo Q-value (the chance of finishing correctly
after taking it).  When those differ by at least a margin, the better step is "chosen" and
the worse "rejected": a step-level preference whose prompt is the context the policy sampled
both from (its prompt, then the shared steps), as step-wise DPO trains on.  Every problem's
trajectories share prefix 0 (the problem alone), so each problem with two or more sampled
solutions contributes; longer shared prefixes add pairs deeper in the solution.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ScoredTrajectory:
    """A trajectory's chunks and its Q(0..n) (None where the prefix was not sampled)."""

    trajectory_id: int
    problem_id: str
    question: str
    chunks: tuple[str, ...]
    q: tuple[float | None, ...]
    prompt: str = ""
    """The policy prompt it was sampled from (rollouts continue from prompt + chunks)."""


@dataclass(frozen=True)
class StepPair:
    problem_id: str
    question: str
    prefix: tuple[str, ...]
    policy_prompt: str
    chosen: str
    rejected: str
    q_chosen: float
    q_rejected: float
    chosen_trajectory: int
    rejected_trajectory: int


def q_pairs(trajectories: Iterable[ScoredTrajectory], margin: float) -> list[StepPair]:
    """One pair per shared prefix: its best next step against its worst, when their Q-values
    differ by at least ``margin``.  Identical next steps count once (the first trajectory's);
    steps whose Q was not sampled are left out.  Deterministic: ties go to the lower id."""
    siblings: dict[tuple[str, str, tuple[str, ...]], dict[str, tuple[float, int, str]]] = {}
    for t in sorted(trajectories, key=lambda t: t.trajectory_id):
        for k in range(len(t.chunks)):
            q_next = t.q[k + 1] if k + 1 < len(t.q) else None
            if q_next is None:
                continue
            # siblings share the problem, the policy prompt and the steps before: the same context
            group = siblings.setdefault((t.problem_id, t.prompt, t.chunks[:k]), {})
            group.setdefault(t.chunks[k], (q_next, t.trajectory_id, t.question))
    pairs: list[StepPair] = []
    ordered = sorted(siblings.items(), key=lambda kv: (kv[0][0], len(kv[0][2]), kv[0][2], kv[0][1]))
    for (problem_id, policy_prompt, prefix), steps in ordered:
        if len(steps) < 2:
            continue
        ranked = sorted(steps.items(), key=lambda kv: (-kv[1][0], kv[1][1]))
        (best, (q_best, t_best, question)), (worst, (q_worst, t_worst, _)) = ranked[0], ranked[-1]
        if q_best - q_worst >= margin - 1e-9:  # Q-values are fractions k/M: no float misses
            pairs.append(
                StepPair(problem_id, question, prefix, policy_prompt, best, worst, q_best, q_worst, t_best, t_worst)
            )
    return pairs


def prompt_of(policy_prompt: str, prefix: Sequence[str]) -> str:
    """The DPO prompt: the context the policy sampled the next step from, its prompt then the
    steps so far byte for byte (a pair in any other context teaches another conditional)."""
    return policy_prompt + "".join(prefix)
