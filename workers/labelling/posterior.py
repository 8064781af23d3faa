"""What the samples of a chunk's two prefixes say about its relative-rule label (pure).

The adaptive budget decides a relative-rule label from the Q-values of the prefixes before and
after a chunk, which it knows only through samples.  The two Q-values get a joint prior on a
grid, and the samples' binomial likelihoods make it a posterior:

- each Q alone has a symmetric Beta(a, a) prior; ½ is Jeffreys' prior, larger values pull
  small-sample estimates toward ½, which keeps the ratio of two small-sample estimates (what
  Rel-Ratio reads) from swinging to 0 or to infinity on one sample;
- the neighbouring prefix is evidence too: assuming most chunks of a chain of thought change
  the chance of success little, with weight ``link`` the Q after a chunk is drawn near the Q before it
  (a Gaussian of width ``LINK_WIDTH`` on the log-odds scale), and otherwise anywhere.  A chunk
  that does change Q needs more samples to show it; one that does not is settled sooner.

``settling_gain`` is the preposterior question the budget asks before spending more: how much
could the rest of the budget raise the chance that the label is right?
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from stepq.workers.labelling.labels import LabelRule

GRID = 32
LINK_WIDTH = 0.5
"""Standard deviation, in log-odds, of the Q after a chunk that keeps the Q before it."""

_XS = tuple((j + 0.5) / GRID for j in range(GRID))


@dataclass(frozen=True)
class Prefix:
    """A prefix as a chunk's label sees it: its samples and successes and how many more the
    budget allows, or its exact Q when that is known (the outcome, or a dead prefix)."""

    samples: int = 0
    successes: int = 0
    more: int = 0
    known: float | None = None


@lru_cache(maxsize=64)
def _marginal(strength: float) -> np.ndarray:
    x = np.array(_XS)
    w = np.exp((strength - 1) * (np.log(x) + np.log1p(-x)))
    return w / w.sum()


@lru_cache(maxsize=64)
def _joint(strength: float, link: float) -> np.ndarray:
    """The prior of (Q before, Q after) on the grid: rows before, columns after."""
    marginal = _marginal(strength)
    logit = np.log(np.array(_XS)) - np.log1p(-np.array(_XS))
    near = np.exp(-((logit[None, :] - logit[:, None]) ** 2) / (2 * LINK_WIDTH**2))
    near /= near.sum(axis=1, keepdims=True)
    return marginal[:, None] * (link * near + (1 - link) * marginal[None, :])


_INDICATORS: dict[tuple[str, tuple[float, ...], tuple[float, ...]], np.ndarray] = {}


def _indicator(rule: LabelRule, before: tuple[float, ...], after: tuple[float, ...]) -> np.ndarray:
    """The rule on every pair of support points, computed once per rule and supports."""
    key = (rule.key, before, after)
    if key not in _INDICATORS:
        _INDICATORS[key] = np.array([[rule(b, a) for a in after] for b in before], dtype=float)
    return _INDICATORS[key]


def _support(p: Prefix) -> tuple[float, ...]:
    return (p.known,) if p.known is not None else _XS


def _likelihood(p: Prefix) -> np.ndarray:
    if p.known is not None:
        return np.ones(1)
    x = np.array(_XS)
    return x**p.successes * (1 - x) ** (p.samples - p.successes)


def _futures(p: Prefix) -> np.ndarray:
    """Rows: each number of successes the remaining ``more`` samples could show; columns: its
    probability at each grid Q.  One row of ones when nothing more will be drawn."""
    if p.known is not None or p.more <= 0:
        return np.ones((1, len(_support(p))))
    x = np.array(_XS)
    return np.array([math.comb(p.more, s) * x**s * (1 - x) ** (p.more - s) for s in range(p.more + 1)])


def _prior(before: Prefix, after: Prefix, strength: float, link: float) -> np.ndarray:
    if before.known is None and after.known is None:
        return _joint(strength, link)
    side = [np.ones(1) if p.known is not None else _marginal(strength) for p in (before, after)]
    return np.outer(side[0], side[1])


def p_positive(rule: LabelRule, before: Prefix, after: Prefix, strength: float = 0.5, link: float = 0.0) -> float:
    """The posterior probability that the chunk between the two prefixes is positive."""
    prior = _prior(before, after, strength, link)
    weights = _likelihood(before)[:, None] * prior * _likelihood(after)[None, :]
    hits = _indicator(rule, _support(before), _support(after))
    return float((weights * hits).sum() / weights.sum())


def settling_gain(rule: LabelRule, before: Prefix, after: Prefix, strength: float = 0.5, link: float = 0.0) -> float:
    """How much the rest of the budget could raise the chance that the chunk's label is right:
    the expected accuracy of the likelier label after every remaining sample (averaged over
    what they could show) minus its accuracy now.  Near zero means no affordable evidence can
    settle the chunk (two prefixes of nearly the same small Q, say): sampling on is waste."""
    prior = _prior(before, after, strength, link)
    hits = _indicator(rule, _support(before), _support(after))
    ahead_before = _futures(before) * _likelihood(before)[None, :]
    ahead_after = _futures(after) * _likelihood(after)[None, :]
    every = ahead_before @ prior @ ahead_after.T  # joint weight of each pair of futures
    positive = ahead_before @ (prior * hits) @ ahead_after.T
    total = every.sum()
    now = positive.sum() / total
    later = np.maximum(positive, every - positive).sum() / total
    return float(later - max(now, 1 - now))
