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
  from its samples (``posterior.py``), and sampling stops once one label has at least that
  posterior probability, but never before each of the two prefixes has ``min_samples``
  samples (no decision rests on the prior alone);
- it also stops when the rest of the chunk's budget could not settle it: when all the
  samples it may still draw are expected to raise the label's accuracy by less than
  ``settle`` (two prefixes of nearly the same small Q cost all M samples each and still
  leave a coin flip).  Then, as when the budget of M is spent, the likelier label is taken:
  the Bayes decision rather than the plug-in ratio.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from stepq.models.errors import ConfigError
from stepq.workers.labels import LabelRule, label_chunks
from stepq.workers.posterior import Prefix, p_positive, settling_gain
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

    @property
    def pinned(self) -> str: ...

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

    @property
    def pinned(self) -> str:
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


def probed(key: str, k: int, share: float) -> bool:
    """Whether prefix ``k`` of trajectory ``key`` is one of the ``share`` of skipped prefixes
    that get a probe round (a fixed draw: the same on every worker and retry)."""
    return share > 0 and derive_seed("probe", key, k) < share * 0x7FFFFFFF


PROBE_SAMPLES = 4
"""Samples in a probe of a prefix inferred dead."""


@dataclass(frozen=True)
class Adaptive:
    round_size: int = 2
    """Samples per prefix per round while a relative-rule label is open."""
    confidence: float = 0.75
    """Posterior probability at which a relative-rule label is taken."""
    min_samples: int = 2
    """Samples each prefix needs before a label may rest on them (unless it is certain)."""
    probe: float = 0.1
    """Share of the prefixes it would skip as dead that still get ``PROBE_SAMPLES`` samples."""
    settle: float = 0.12
    """Least expected gain in a chunk's label accuracy that the rest of its budget must offer
    for sampling to go on (0: sample until settled or spent)."""
    prior: float = 1.5
    """Strength of the symmetric Beta prior on each prefix's Q (0.5: Jeffreys)."""
    link: float = 0.5
    """Prior weight of "the chunk keeps the Q before it" (``posterior.py``; 0: independent)."""

    @property
    def spec(self) -> str:
        """The short form people read and type: ``adaptive`` and only the parameters that
        differ from this release's defaults."""
        default = Adaptive()
        return self._spell(lambda field_: getattr(self, field_) != getattr(default, field_))

    @property
    def pinned(self) -> str:
        """The stored form, every parameter spelled out: a set planned today keeps its
        budget when a later release changes the defaults (``problem_sets.budget_policy``)."""
        return self._spell(lambda field_: True)

    def _spell(self, keep: Callable[[str], bool]) -> str:
        parts = [f"{key}={getattr(self, field_):g}" for key, field_ in _PARAMS.items() if keep(field_)]
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

        def ask(k: int, size: int = self.round_size) -> None:
            if k < n and k not in requests:
                idx = _next_indices(obs.rewards.get(k, {}), cap, size)
                if idx:
                    requests[k] = idx

        alive[n] = obs.outcome
        # "Dead stays dead" is checked, not assumed: a share of the prefixes inferred dead
        # (never sampled themselves) get one round; a success there makes them, and every
        # prefix before them, alive, and the labels follow.
        for k in range(first_dead + 1, n):
            if alive[k] is False and eff[k][0] == t and probed(obs.key, k, self.probe):
                ask(k, PROBE_SAMPLES)
        undecided = [k for k in range(n + 1) if alive[k] is None]
        if undecided:  # binary search between the last alive and the first dead prefix
            ask(undecided[len(undecided) // 2])
        q: list[float | None] = [(c / s if s else None) for s, c in eff] + [float(obs.outcome)]
        if rule.name == "abs-q":
            return Decision(requests, [alive[i] for i in range(1, n + 1)], q)

        def prefix(k: int) -> Prefix:
            if k == n:
                return Prefix(known=float(obs.outcome))
            if alive[k] is False:
                return Prefix(known=0.0)
            samples, successes = eff[k]
            return Prefix(samples, successes, more=m - samples)  # eff counts the trajectory: M in all

        labels: list[bool | None] = []
        for i in range(1, n + 1):
            if alive[i - 1] is None or alive[i] is None:
                labels.append(None)
                continue
            before, after = prefix(i - 1), prefix(i)
            p_pos = p_positive(rule, before, after, self.prior, self.link)
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
            elif self.settle > 0 and settling_gain(rule, before, after, self.prior, self.link) < self.settle:
                labels.append(p_pos >= 0.5)  # what the budget has left cannot settle it
            else:
                labels.append(None)
                # sample the less-known side of the chunk (both when equally known)
                sides = [k for k in (i - 1, i) if self._can_sample(obs, k, cap)]
                fewest = min(eff[k][0] for k in sides)
                for k in sides:
                    if eff[k][0] == fewest:
                        ask(k)
        return Decision(requests, labels, q)


_BUDGET = re.compile(r"^\s*(exhaustive|adaptive)\s*(?::(.*))?$")
_PARAMS = {
    "confidence": "confidence",
    "min": "min_samples",
    "round": "round_size",
    "probe": "probe",
    "settle": "settle",
    "prior": "prior",
    "link": "link",
}
"""Spec keys of the adaptive budget and the fields they set."""
_INTEGER = {"min_samples", "round_size"}


def parse_budget(spec: str) -> BudgetPolicy:
    """Read ``exhaustive`` or ``adaptive[:confidence=C,min=N,round=R,probe=P,settle=S,prior=A,link=L]``."""
    match = _BUDGET.match(spec.lower())
    if not match:
        raise ConfigError(f"unknown budget policy '{spec}' (exhaustive or adaptive[:{'=…,'.join(_PARAMS)}=…])")
    if match.group(1) == "exhaustive":
        if match.group(2):
            raise ConfigError("the exhaustive budget takes no parameters")
        return Exhaustive()
    values: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in (match.group(2) or "").split(","))):
        key, _, value = part.partition("=")
        if key not in _PARAMS:
            raise ConfigError(f"unknown adaptive budget parameter '{key}' (one of: {', '.join(_PARAMS)})")
        try:
            values[_PARAMS[key]] = float(value)
        except ValueError:
            raise ConfigError(f"budget parameter {key}={value!r} is not a number") from None
    policy = Adaptive(**{k: int(v) if k in _INTEGER else v for k, v in values.items()})  # type: ignore[arg-type]
    if not (
        0.5 < policy.confidence < 1
        and policy.round_size >= 1
        and policy.min_samples >= 0
        and 0 <= policy.probe <= 1
        and 0 <= policy.settle < 0.5
        and policy.prior > 0
        and 0 <= policy.link < 1
    ):
        raise ConfigError(
            "adaptive budget needs 0.5 < confidence < 1, round >= 1, min >= 0, 0 <= probe <= 1, "
            "0 <= settle < 0.5, prior > 0 and 0 <= link < 1"
        )
    return policy
