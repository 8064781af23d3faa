"""Budget policies: which rollouts to sample next for a trajectory, and the labels so far.

Pure functions of what is known (rollout rewards per prefix and the trajectory's outcome),
so a task can stop anywhere and whoever picks the trajectory up next re-derives the same
plan from the database.  Sample indices are fixed seeds, so "sample i of prefix k" is the
same draw whichever policy, worker or retry asks for it.

``exhaustive`` samples M rollouts for every prefix (the paper).  ``adaptive`` never samples
what cannot change a label:

- the trajectory's own continuation is a sample of every prefix when it was drawn from the
  same policy and sampling settings as the rollouts, so it counts as one of the M; so does
  each sibling's (another trajectory of the problem, same policy and prompt) for the
  prefixes the two share: the prompt, and any first chunks they wrote alike;
- a prefix with a success is alive, and so is every shorter prefix (a success from prefix
  i is a continuation of every prefix before it); a prefix with no success in M samples is
  dead, and (the OmegaPRM assumption) so is every longer prefix: a solution that cannot
  be finished from step i cannot be finished from a later step that continues it.  Dead
  and alive prefixes of a wrong trajectory are separated by a search that prices tokens
  (``search_point``: a rollout from a late prefix writes less), and the prefixes taken as
  dead without sampling are probed, so a policy that recovers is caught where it does;
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
from dataclasses import dataclass, field, replace
from typing import Protocol

from stepq.models.errors import ConfigError
from stepq.workers.labelling.dead_prefix_probe import answer_surplus, search_point, stop_scale
from stepq.workers.labelling.labels import LabelRule, label_chunks
from stepq.workers.labelling.posterior import Prefix, p_positive, settling_gain
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
    chunk_sizes: tuple[int, ...] = ()
    """Characters per chunk: how long a rollout from each prefix is likely to be (its rest);
    empty when unknown (every chunk alike)."""
    siblings: tuple[tuple[int, bool], ...] = ()
    """(chunks shared, outcome) of the problem's other trajectories drawn by the same policy
    from the same prompt: each outcome is a sample of every prefix they share with this one."""


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

    @property
    def asks_once(self) -> bool:
        """Its first decision asks for every rollout the labels need: once those are written
        the trajectory is done, whatever they say (a worker may commit them behind its back)."""
        ...

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

    @property
    def asks_once(self) -> bool:
        return True

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


@dataclass(frozen=True)
class Adaptive:
    round_size: int = 2
    """Samples per prefix per round while a relative-rule label is open."""
    confidence: float = 0.75
    """Posterior probability at which a relative-rule label is taken."""
    min_samples: int = 2
    """Samples each prefix needs before a label may rest on them (unless it is certain)."""
    probe: float = 1.0
    """Share of the prefixes it would skip as dead that still get ``probe_samples`` samples."""
    probe_samples: int = 4
    """Samples in a probe of a prefix inferred dead."""
    settle: float = 0.12
    """Least expected gain in a chunk's label accuracy that the rest of its budget must offer
    for sampling to go on (0: sample until settled or spent)."""
    prior: float = 1.5
    """Strength of the symmetric Beta prior on each prefix's Q (0.5: Jeffreys)."""
    link: float = 0.5
    """Prior weight of "the chunk keeps the Q before it" (``posterior.py``; 0: independent)."""
    cost: float = 1
    """1: the search for the first dead prefix probes where it expects to spend the fewest
    tokens (``search_point``); 0: the middle (binary search by position)."""
    siblings: float = 1
    """1: the outcomes of the problem's other trajectories count as samples of the prefixes
    they share with this one (when all are samples of the rollout policy); 0: ignored."""
    stop: float = 1
    """1: the value-of-information stop asks more of dear samples than of cheap ones (gain per
    token: ``settle`` scaled by the chunk's rollout length against the trajectory's mean,
    ``stop_scale``); 0: the same ``settle`` for every chunk."""
    side: float = 1
    """1: an open relative-rule chunk samples the side of it where a round buys the most label
    accuracy per generated token (each side's value of information alone, over the chunks a
    rollout from it writes: the prefix before the chunk writes one chunk more); 0: the side
    with fewer samples (both when equal)."""

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

    @property
    def asks_once(self) -> bool:
        return False  # each round's outcomes decide the next

    def decide(self, obs: Observation, rule: LabelRule) -> Decision:
        """Prove prefixes alive or dead, probe some inferred dead, bisect between the last
        alive and the first dead; for a relative rule, then settle each chunk's label from
        the posterior of the Q-values on both sides of it."""
        ev = _Evidence.of(obs, bool(self.siblings))
        alive, first_dead = _liveness(obs, ev)
        asks = _Asks(obs, ev.caps, self.round_size)
        alive[ev.n] = obs.outcome
        # "Dead stays dead" is checked, not assumed: a share of the prefixes inferred dead
        # (never sampled themselves) get one round; a success there makes them, and every
        # prefix before them, alive, and the labels follow.
        for k in range(first_dead + 1, ev.n):
            if alive[k] is False and ev.drawn[k] == 0 and probed(obs.key, k, self.probe):
                asks(k, self.probe_samples)
        undecided = [k for k in range(ev.n + 1) if alive[k] is None]
        if undecided:  # search between the last alive and the first dead prefix
            lo, hi = undecided[0] - 1, undecided[-1] + 1
            if self.cost:
                asks(search_point(lo, hi, ev.n, ev.surplus))
            else:
                asks(undecided[len(undecided) // 2])
        q = ev.q_values(obs.outcome)
        if rule.name == "abs-q":
            return Decision(asks.requests, [alive[i] for i in range(1, ev.n + 1)], q)
        labels = [self._relative_label(rule, obs, ev, alive, i, asks) for i in range(1, ev.n + 1)]
        return Decision(asks.requests, labels, q)

    def _relative_label(
        self, rule: LabelRule, obs: Observation, ev: _Evidence, alive: list[bool | None], i: int, asks: _Asks
    ) -> bool | None:
        """Chunk i's label under a relative rule, or None (and the samples that would settle it)."""
        if alive[i - 1] is None or alive[i] is None:
            return None
        before, after = ev.prefix(i - 1, alive, obs.outcome), ev.prefix(i, alive, obs.outcome)
        p_pos = p_positive(rule, before, after, self.prior, self.link)
        early = all(k == ev.n or alive[k] is False or ev.samples(k) >= self.min_samples for k in (i - 1, i))
        certain = p_pos <= 1e-9 or p_pos >= 1 - 1e-9  # whatever the unknown Q-values are
        if not early and not certain:
            asks(i - 1)
            asks(i)
            return None
        if p_pos >= self.confidence:
            return True
        if p_pos <= 1 - self.confidence:
            return False
        if not (ev.can_sample(obs, i - 1) or ev.can_sample(obs, i)):
            return p_pos >= 0.5  # the budget is spent: the likelier label
        settle = self.settle * (stop_scale(i, ev.n, ev.surplus) if self.stop else 1.0)
        if settle > 0 and settling_gain(rule, before, after, self.prior, self.link) < settle:
            return p_pos >= 0.5  # what the budget has left cannot settle it (for what it costs)
        sides = [k for k in (i - 1, i) if ev.can_sample(obs, k)]
        cheapest = self.best_buy(rule, before, after, i, ev.n, ev.surplus) if self.side and len(sides) == 2 else None
        if cheapest is not None:
            asks(cheapest)
            return None
        # sample the less-known side of the chunk (both when equally known)
        fewest = min(ev.samples(k) for k in sides)
        for k in sides:
            if ev.samples(k) == fewest:
                asks(k)
        return None

    def best_buy(
        self, rule: LabelRule, before: Prefix, after: Prefix, i: int, n: int, surplus: float = 0.0
    ) -> int | None:
        """The side of open chunk i (prefix i - 1 or i) whose next round alone raises the
        label's expected accuracy the most per chunk generated, a rollout from prefix k writing
        n - k chunks and the answer's ``surplus``; None when neither round alone would."""
        best: tuple[float, int] | None = None
        for k, side in ((i - 1, before), (i, after)):
            more = min(self.round_size, side.more)
            if more <= 0 or side.known is not None:
                continue
            b = replace(before, more=more if k == i - 1 else 0)
            a = replace(after, more=more if k == i else 0)
            gain = settling_gain(rule, b, a, self.prior, self.link)
            per_chunk = gain / (more * (n - k + surplus))
            if gain > 1e-9 and (best is None or per_chunk > best[0]):
                best = (per_chunk, k)
        return best[1] if best is not None else None


@dataclass(frozen=True)
class _Evidence:
    """Per prefix k < n: samples and successes.  When the trajectory is a sample of the rollout
    policy (``t`` = 1) it is one of the M samples of each of its prefixes, and so is each
    sibling's outcome for the prefixes the two share (the first ones, in id order, up to M):
    the prefix then needs that many fewer rollouts of its own (``caps``)."""

    n: int
    m: int
    t: int
    counts: list[tuple[int, int]]
    caps: list[int]
    """Rollouts of its own each prefix may draw: M less the trajectory and the siblings."""
    drawn: list[int]
    surplus: float
    """How much longer than a step the answer's chunk is (``answer_surplus``), read once."""

    @staticmethod
    def of(obs: Observation, use_siblings: bool = True) -> _Evidence:
        t = 1 if obs.trajectory_is_sample else 0
        counts, caps, drawn = [], [], []
        for k in range(obs.n_chunks):
            shared = [o for length, o in obs.siblings if length >= k] if t and use_siblings else []
            shared = shared[: obs.m - t]
            cap = obs.m - t - len(shared)
            rolls = [r for i, r in obs.rewards.get(k, {}).items() if i < cap]
            counts.append((len(rolls) + t + len(shared), sum(rolls) + t * int(obs.outcome) + sum(shared)))
            caps.append(cap)
            drawn.append(len(rolls))
        return _Evidence(obs.n_chunks, obs.m, t, counts, caps, drawn, answer_surplus(obs.chunk_sizes))

    def samples(self, k: int) -> int:
        return self.counts[k][0]

    def can_sample(self, obs: Observation, k: int) -> bool:
        return k < self.n and bool(_next_indices(obs.rewards.get(k, {}), self.caps[k], 1))

    def q_values(self, outcome: bool) -> list[float | None]:
        return [(c / s if s else None) for s, c in self.counts] + [float(outcome)]

    def prefix(self, k: int, alive: list[bool | None], outcome: bool) -> Prefix:
        if k == self.n:
            return Prefix(known=float(outcome))
        if alive[k] is False:
            return Prefix(known=0.0)
        samples, successes = self.counts[k]
        return Prefix(samples, successes, more=self.m - samples)  # the counts include the trajectory: M in all


def _liveness(obs: Observation, ev: _Evidence) -> tuple[list[bool | None], int]:
    """Which prefixes are proven alive (a success drawn from them) or dead (M failures), and
    what follows: every prefix before an alive one is alive, every one after a dead one dead.
    Returns the per-prefix verdicts (None: unknown; index n is the complete solution) and the
    first dead prefix (n + 1 when none)."""
    n = ev.n
    alive: list[bool | None] = [True if c > 0 else False if s >= ev.m else None for s, c in ev.counts]
    # The trajectory's own success makes its prefixes alive only if the rollout policy
    # could have written it, i.e. when it is a sample of that policy.
    alive.append(obs.outcome if (ev.t or not obs.outcome) else None)
    last_alive = max((k for k, a in enumerate(alive) if a), default=-1)
    first_dead = min((k for k, a in enumerate(alive) if a is False), default=n + 1)
    for k in range(n + 1):
        if alive[k] is None:
            alive[k] = True if k < last_alive else False if k > first_dead else None
    return alive, first_dead


class _Asks:
    """The samples to draw next, per prefix; the first ask for a prefix sets its size."""

    def __init__(self, obs: Observation, caps: list[int], round_size: int) -> None:
        self.obs, self.caps, self.round_size = obs, caps, round_size
        self.requests: dict[int, list[int]] = {}

    def __call__(self, k: int, size: int | None = None) -> None:
        if k < self.obs.n_chunks and k not in self.requests:
            idx = _next_indices(self.obs.rewards.get(k, {}), self.caps[k], size or self.round_size)
            if idx:
                self.requests[k] = idx


_BUDGET = re.compile(r"^\s*(exhaustive|adaptive)\s*(?::(.*))?$")
_PARAMS = {
    "confidence": "confidence",
    "min": "min_samples",
    "round": "round_size",
    "probe": "probe",
    "probe_n": "probe_samples",
    "settle": "settle",
    "prior": "prior",
    "link": "link",
    "cost": "cost",
    "sib": "siblings",
    "stop": "stop",
    "side": "side",
}
"""Spec keys of the adaptive budget and the fields they set."""
_INTEGER = {"min_samples", "round_size", "probe_samples"}
_ADDED: tuple[dict[str, float], ...] = (
    {"probe_samples": 4.0, "cost": 0.0, "siblings": 0.0, "stop": 0.0},
    {"side": 0.0},
)
"""Parameters added after sets were first pinned, release by release, with the values that
behave as before them: a spec naming every parameter but those added since some release is
that release's pinned form and gets these."""


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
    missing = set(_PARAMS.values()) - set(values)
    for since in range(len(_ADDED)):
        added = {k: v for release in _ADDED[since:] for k, v in release.items()}
        if missing == set(added):
            values.update(added)
            break
    policy = Adaptive(**{k: int(v) if k in _INTEGER else v for k, v in values.items()})  # type: ignore[arg-type]
    if not (
        0.5 < policy.confidence < 1
        and policy.round_size >= 1
        and policy.min_samples >= 0
        and 0 <= policy.probe <= 1
        and policy.probe_samples >= 1
        and 0 <= policy.settle < 0.5
        and policy.prior > 0
        and 0 <= policy.link < 1
        and policy.cost in (0, 1)
        and policy.siblings in (0, 1)
        and policy.stop in (0, 1)
        and policy.side in (0, 1)
    ):
        raise ConfigError(
            "adaptive budget needs 0.5 < confidence < 1, round >= 1, min >= 0, 0 <= probe <= 1, "
            "probe_n >= 1, 0 <= settle < 0.5, prior > 0, 0 <= link < 1, cost, sib, stop and side 0 or 1"
        )
    return policy
