"""Label rules: turn Q-values into a chunk's positive/negative label (pure functions).

Chunk i (1-based) is judged on Q_i = Q(prefix i), after the chunk, and Q_{i-1}, before
it; the first chunk's "before" is Q(0), the problem alone.

Edge case the paper leaves open, decided here: for Rel-Ratio with Q_{i-1} = 0 the ratio
is undefined.  A dead prefix cannot get worse, so the chunk is positive iff it revives
the solution (Q_i > 0), i.e. the ratio is read as +inf when Q_i > 0 and 0 when Q_i = 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stepq.models.errors import ConfigError


def abs_q(q_before: float, q_after: float) -> bool:
    """Positive iff the solution can still end correct after the chunk."""
    return q_after > 0


def rel_ratio(q_before: float, q_after: float, gamma: float = 0.8) -> bool:
    """Positive iff the chunk keeps at least a ``gamma`` share of the success chance."""
    if q_before == 0:
        return q_after > 0
    return q_after / q_before > gamma


def best_of_4(q: float) -> float:
    """Qµ: success chance of a best-of-4 policy from a prefix with success chance q."""
    return 1.0 - (1.0 - q) ** 4


def rel_effective(q_before: float, q_after: float, alpha: float = 0.4) -> bool:
    """Positive iff Q_i + α·(Qµ_i − Qµ_{i−1}) > 0: value plus the chunk's advantage."""
    return q_after + alpha * (best_of_4(q_after) - best_of_4(q_before)) > 0


@dataclass(frozen=True)
class LabelRule:
    """A rule with its parameters; ``key`` is the canonical text stored with labels."""

    name: str
    params: dict[str, float] = field(default_factory=dict)

    @property
    def key(self) -> str:
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v:g}" for k, v in sorted(self.params.items()))

    def __call__(self, q_before: float, q_after: float) -> bool:
        fn: Callable[..., bool] = RULES[self.name][0]
        return fn(q_before, q_after, **self.params)

    @property
    def needs_before(self) -> bool:
        return self.name != "abs-q"


RULES: dict[str, tuple[Callable[..., bool], dict[str, float]]] = {
    "abs-q": (abs_q, {}),
    "rel-ratio": (rel_ratio, {"gamma": 0.8}),
    "rel-effective": (rel_effective, {"alpha": 0.4}),
}

_SPEC = re.compile(r"^\s*([a-z-]+)\s*(?::(.*))?$")


def parse_rule(spec: str) -> LabelRule:
    """Read ``abs-q``, ``rel-ratio:gamma=0.7`` or ``rel-effective:alpha=0.8``."""
    m = _SPEC.match(spec.lower())
    if not m or m.group(1) not in RULES:
        raise ConfigError(f"unknown label rule '{spec}' (one of: {', '.join(RULES)})")
    name, rest = m.group(1), m.group(2)
    params = dict(RULES[name][1])
    for part in filter(None, (p.strip() for p in (rest or "").split(","))):
        key, _, value = part.partition("=")
        if key not in params:
            raise ConfigError(f"label rule '{name}' has no parameter '{key}'")
        try:
            params[key] = float(value)
        except ValueError:
            raise ConfigError(f"label rule parameter {key}={value!r} is not a number") from None
        if not math.isfinite(params[key]):
            raise ConfigError(f"label rule parameter {key} must be finite")
    return LabelRule(name, params)


def label_chunks(rule: LabelRule, q: Sequence[float | None]) -> list[bool | None]:
    """Labels for chunks 1..n from Q(0..n); None where a needed Q-value is unknown."""
    out: list[bool | None] = []
    for i in range(1, len(q)):
        before, after = q[i - 1], q[i]
        if after is None or (before is None and rule.needs_before):
            out.append(None)
        else:
            out.append(rule(before if before is not None else 0.0, after))
    return out
