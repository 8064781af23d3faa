"""Budget policies: which rollouts to sample next for a trajectory, and the labels so far.

Pure functions of what is known (rollout rewards per prefix and the trajectory's outcome),
so a task can stop anywhere and whoever picks the trajectory up next re-derives the same
plan from the database.  Sample indices are fixed seeds, so "sample i of prefix k" is the
same draw whichever policy, worker or retry asks for it.

``exhaustive`` samples M rollouts for every prefix (the paper).  ``adaptive`` never samples
what cannot change a label:

- the trajectory's own continuation is a sample of every prefix when it was drawn from the
  same policy and sampling settings as the rollouts, so it counts as one of the M;
- a prefix with a success is alive, and so is every shorter prefix (a success from prefix
  i is a continuation of every prefix before it); a prefix with no success in M samples is
  dead, and (the OmegaPRM assumption) so is every longer prefix: a solution that cannot
  be finished from step i cannot be finished from a later step that continues it.  Dead
  and alive prefixes of a wrong trajectory are separated by binary search;
- Abs-Q needs nothing more: a chunk is positive iff its prefix is alive;
- for the relative rules a chunk between two alive prefixes is sampled in rounds until its
  label is settled with the stated confidence: each prefix's true Q has a Beta posterior
  (Jeffreys prior) from its samples, and sampling stops once one label has at least that
  posterior probability, but never before each of the two prefixes has ``min_samples``
  samples (no decision rests on the prior alone).  When the budget of M is spent the
  likelier label is taken, which is the Bayes decision rather than the plug-in ratio.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

from stepq.models.errors import ConfigError
from stepq.workers.labels import LabelRule, label_chunks
from stepq.workers.seeds import derive_seed


@dataclass(frozen=True)
class Observation:
    """Everything known about one trajectory; ``rewards[k][i]`` is sample i of prefix k."""

    n_chunks: int
    m: int
    outcome: bool
    rewards: Mapping[int, Mapping[int, int]] = field(default_factory=dict)
    trajectory_is_sample: bool = False
    key: str = ""
    """The trajectory's identity: which skipped prefixes it probes is a function of it."""


@dataclass(frozen=True)
class Decision:
    """Sample indices to draw next per prefix, and labels for chunks 1..n (None: undecided)."""

    requests: dict[int, list[int]]
    labels: list[bool | None]
    q: list[float | None]

    @property
    def done(self) -> bool:
        return not self.requests


class BudgetPolicy(Protocol):
    @property
    def spec(self) -> str: ...

    def counts_trajectory(self) -> bool: ...

    def decide(self, obs: Observation, rule: LabelRule) -> Decision: ...


def _next_indices(have: Mapping[int, int], cap: int, want: int) -> list[int]:
    """The lowest sample indices below ``cap`` not drawn yet, at most ``want`` of them."""
    out: list[int] = []
    for i in range(cap):
        if len(out) >= want:
            break
        if i not in have:
            out.append(i)
    return out


@dataclass(frozen=True)
class Exhaustive:
    @property
    def spec(self) -> str:
        return "exhaustive"

    def counts_trajectory(self) -> bool:
        return False

    def decide(self, obs: Observation, rule: LabelRule) -> Decision:
        requests: dict[int, list[int]] = {}
        q: list[float | None] = [None] * (obs.n_chunks + 1)
        for k in range(obs.n_chunks):
            have = obs.rewards.get(k, {})
            missing = _next_indices(have, obs.m, obs.m)
            if missing:
                requests[k] = missing
            else:
                q[k] = sum(r for i, r in have.items() if i < obs.m) / obs.m
        q[obs.n_chunks] = float(obs.outcome)
        return Decision(requests, label_chunks(rule, q), q)


POSTERIOR_GRID = 32


@lru_cache(maxsize=65536)
def posterior(n: int, c: int) -> tuple[tuple[float, float], ...]:
    """(Q, probability) on a grid: the Beta(½ + c, ½ + n − c) posterior of a prefix's true Q
    after c successes in n samples (Jeffreys prior)."""
    a, b = 0.5 + c, 0.5 + n - c
    xs = [(j + 0.5) / POSTERIOR_GRID for j in range(POSTERIOR_GRID)]
    weights = [math.exp((a - 1) * math.log(x) + (b - 1) * math.log(1 - x)) for x in xs]
    total = sum(weights)
    return tuple((x, w / total) for x, w in zip(xs, weights, strict=True))


def probed(key: str, k: int, share: float) -> bool:
    """Whether prefix ``k`` of trajectory ``key`` is one of the ``share`` of skipped prefixes
    that get a probe round (a fixed draw: the same on every worker and retry)."""
    return share > 0 and derive_seed("probe", key, k) < share * 0x7FFFFFFF


@dataclass(frozen=True)
class Adaptive:
    round_size: int = 4
    confidence: float = 0.75
    min_samples: int = 4
    probe: float = 0.1
    """Share of the prefixes it would skip as dead that still get one round of samples."""

    @property
    def spec(self) -> str:
        """The stored form: ``adaptive`` and only the parameters that differ from the defaults
        (it must fit ``problem_sets.budget_policy``, 40 characters)."""
        default = Adaptive()
        parts = [
            f"{key}={value:g}"
            for key, value, usual in (
                ("confidence", self.confidence, default.confidence),
                ("min", self.min_samples, default.min_samples),
                ("round", self.round_size, default.round_size),
                ("probe", self.probe, default.probe),
            )
            if value != usual
        ]
        return "adaptive" + (":" + ",".join(parts) if parts else "")

    def counts_trajectory(self) -> bool:
        return True

    @staticmethod
    def _can_sample(obs: Observation, k: int, cap: int) -> bool:
        return k < obs.n_chunks and bool(_next_indices(obs.rewards.get(k, {}), cap, 1))

    def decide(self, obs: Observation, rule: LabelRule) -> Decision:
        n, m = obs.n_chunks, obs.m
        t = 1 if obs.trajectory_is_sample else 0
        cap = m - t  # rollouts per prefix; the trajectory is the M-th sample when it counts
        eff: list[tuple[int, int]] = []
        for k in range(n):
            rolls = [r for i, r in obs.rewards.get(k, {}).items() if i < cap]
            eff.append((len(rolls) + t, sum(rolls) + t * int(obs.outcome)))
        alive: list[bool | None] = [True if c > 0 else False if s >= m else None for s, c in eff]
        # The trajectory's own success makes its prefixes alive only if the rollout policy
        # could have written it, i.e. when it is a sample of that policy.
        alive.append(obs.outcome if (t or not obs.outcome) else None)
        last_alive = max((k for k, a in enumerate(alive) if a), default=-1)
        first_dead = min((k for k, a in enumerate(alive) if a is False), default=n + 1)
        for k in range(n + 1):
            if alive[k] is None:
                alive[k] = True if k < last_alive else False if k > first_dead else None
        requests: dict[int, list[int]] = {}

        def ask(k: int) -> None:
            if k < n and k not in requests:
                idx = _next_indices(obs.rewards.get(k, {}), cap, self.round_size)
                if idx:
                    requests[k] = idx

        alive[n] = obs.outcome
        # "Dead stays dead" is checked, not assumed: a share of the prefixes inferred dead
        # (never sampled themselves) get one round; a success there makes them, and every
        # prefix before them, alive, and the labels follow.
        for k in range(first_dead + 1, n):
            if alive[k] is False and eff[k][0] == t and probed(obs.key, k, self.probe):
                ask(k)
        undecided = [k for k in range(n + 1) if alive[k] is None]
        if undecided:  # binary search between the last alive and the first dead prefix
            ask(undecided[len(undecided) // 2])
        q: list[float | None] = [(c / s if s else None) for s, c in eff] + [float(obs.outcome)]
        if rule.name == "abs-q":
            return Decision(requests, [alive[i] for i in range(1, n + 1)], q)

        def dist(k: int) -> tuple[tuple[float, float], ...]:
            if k == n:
                return ((float(obs.outcome), 1.0),)
            if alive[k] is False:
                return ((0.0, 1.0),)
            return posterior(*eff[k])

        labels: list[bool | None] = []
        for i in range(1, n + 1):
            if alive[i - 1] is None or alive[i] is None:
                labels.append(None)
                continue
            before, after = dist(i - 1), dist(i)
            p_pos = sum(pb * pa for xb, pb in before for xa, pa in after if rule(xb, xa))
            early = all(k == n or alive[k] is False or eff[k][0] >= self.min_samples for k in (i - 1, i))
            certain = p_pos <= 1e-9 or p_pos >= 1 - 1e-9  # whatever the unknown Q-values are
            if not early and not certain:
                labels.append(None)
                ask(i - 1)
                ask(i)
            elif p_pos >= self.confidence:
                labels.append(True)
            elif p_pos <= 1 - self.confidence:
                labels.append(False)
            elif not (self._can_sample(obs, i - 1, cap) or self._can_sample(obs, i, cap)):
                labels.append(p_pos >= 0.5)  # the budget is spent: the likelier label
            else:
                labels.append(None)
                # sample the less-known side of the chunk (both when equally known)
                sides = [k for k in (i - 1, i) if self._can_sample(obs, k, cap)]
                fewest = min(eff[k][0] for k in sides)
                for k in sides:
                    if eff[k][0] == fewest:
                        ask(k)
        return Decision(requests, labels, q)


SPEC_LENGTH = 40
_BUDGET = re.compile(r"^\s*(exhaustive|adaptive)\s*(?::(.*))?$")


def parse_budget(spec: str) -> BudgetPolicy:
    """Read ``exhaustive`` or ``adaptive[:confidence=0.75,min=4,round=4,probe=0.1]``."""
    match = _BUDGET.match(spec.lower())
    if not match:
        raise ConfigError(
            f"unknown budget policy '{spec}' (exhaustive or adaptive[:confidence=C,min=N,round=R,probe=P])"
        )
    if match.group(1) == "exhaustive":
        if match.group(2):
            raise ConfigError("the exhaustive budget takes no parameters")
        return Exhaustive()
    params: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in (match.group(2) or "").split(","))):
        key, _, value = part.partition("=")
        try:
            params[key] = float(value)
        except ValueError:
            raise ConfigError(f"budget parameter {key}={value!r} is not a number") from None
    unknown = set(params) - {"confidence", "round", "min", "probe"}
    if unknown:
        raise ConfigError(f"unknown adaptive budget parameter(s): {', '.join(sorted(unknown))}")
    confidence = params.get("confidence", Adaptive.confidence)
    round_size = int(params.get("round", Adaptive.round_size))
    min_samples = int(params.get("min", Adaptive.min_samples))
    probe = params.get("probe", Adaptive.probe)
    if not 0.5 < confidence < 1 or round_size < 1 or min_samples < 0 or not 0 <= probe <= 1:
        raise ConfigError("adaptive budget needs 0.5 < confidence < 1, round >= 1, min >= 0 and 0 <= probe <= 1")
    policy = Adaptive(round_size=round_size, confidence=confidence, min_samples=min_samples, probe=probe)
    if len(policy.spec) > SPEC_LENGTH:
        raise ConfigError(f"budget '{policy.spec}' is longer than {SPEC_LENGTH} characters: keep more defaults")
    return policy
