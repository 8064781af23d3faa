"""The adaptive budget's posterior over a chunk's two Q-values and its value-of-information
stop, as pure functions, checked against direct computation and against what more information
must (and must not) do."""

from __future__ import annotations

import itertools
import random

import pytest

from stepq.workers.labelling.labels import parse_rule
from stepq.workers.labelling.posterior import GRID, Prefix, p_positive, settling_gain

RATIO = parse_rule("rel-ratio")
EFFECTIVE = parse_rule("rel-effective")


def _beta_grid_mass(successes: int, samples: int, strength: float, accept: object) -> float:
    """Direct, loop-by-loop: the Beta(strength + c, strength + n - c) grid posterior's mass
    where ``accept(x)`` holds."""
    xs = [(j + 0.5) / GRID for j in range(GRID)]
    w = [x ** (strength - 1 + successes) * (1 - x) ** (strength - 1 + samples - successes) for x in xs]
    return sum(wi for wi, x in zip(w, xs, strict=True) if accept(x)) / sum(w)  # type: ignore[operator]


@pytest.mark.parametrize("strength", [0.5, 1.5, 3.0])
@pytest.mark.parametrize(("samples", "successes"), [(0, 0), (4, 1), (16, 12), (16, 0)])
def test_against_a_known_q_the_posterior_is_the_beta_posterior(samples: int, successes: int, strength: float) -> None:
    before = Prefix(known=0.5)
    after = Prefix(samples, successes)
    want = _beta_grid_mass(successes, samples, strength, lambda x: x / 0.5 > 0.8)
    for link in (0.0, 0.5):  # the link prior ties two sampled prefixes only
        assert p_positive(RATIO, before, after, strength, link) == pytest.approx(want, abs=1e-9)


def test_known_prefixes_settle_the_label() -> None:
    assert p_positive(RATIO, Prefix(9, 3), Prefix(known=1.0)) == 1.0, "ending right never loses the chance"
    assert p_positive(RATIO, Prefix(9, 3), Prefix(known=0.0)) == 0.0, "a dead prefix after a live one"
    assert p_positive(EFFECTIVE, Prefix(known=0.0), Prefix(5, 1)) == 1.0


def test_the_link_prior_reads_the_neighbouring_prefix_but_yields_to_clear_evidence() -> None:
    well_known, barely = Prefix(16, 12), Prefix(2, 1)
    independent = p_positive(RATIO, well_known, barely, 1.5, 0.0)
    linked = p_positive(RATIO, well_known, barely, 1.5, 0.5)
    assert independent < 0.5 < linked, "two samples do not overturn 'most chunks keep the chance'"
    assert p_positive(RATIO, Prefix(16, 14), Prefix(16, 0), 1.5, 0.5) < 0.001, "a clear drop stays a drop"
    assert p_positive(RATIO, Prefix(16, 2), Prefix(16, 15), 1.5, 0.5) > 0.999, "and a clear rise a rise"


def test_nothing_left_to_draw_gains_nothing() -> None:
    for link in (0.0, 0.5):
        assert settling_gain(RATIO, Prefix(9, 1), Prefix(9, 1), 1.5, link) == pytest.approx(0.0, abs=1e-12)
        assert settling_gain(RATIO, Prefix(9, 4, 7), Prefix(known=1.0), 1.5, link) == pytest.approx(0.0, abs=1e-12)


def test_more_information_never_lowers_the_expected_accuracy() -> None:
    """Value of information: the gain is never negative and grows with what may be drawn."""
    rng = random.Random(3)
    for _ in range(60):
        rule = rng.choice([RATIO, EFFECTIVE])
        n_b, n_a = rng.randint(0, 8), rng.randint(0, 8)
        c_b, c_a = rng.randint(0, n_b), rng.randint(0, n_a)
        strength, link = rng.choice([0.5, 1.5]), rng.choice([0.0, 0.5])
        gains = [
            settling_gain(rule, Prefix(n_b, c_b, more), Prefix(n_a, c_a, more), strength, link)
            for more in (0, 2, 6, 12)
        ]
        assert gains[0] == pytest.approx(0.0, abs=1e-12)
        assert all(later >= earlier - 1e-9 for earlier, later in itertools.pairwise(gains)), gains


def test_the_gain_separates_settleable_chunks_from_coin_flips() -> None:
    """Two prefixes that both look like Q = 0.1: sixteen samples each leave Rel-Ratio a coin
    flip, while a chunk whose prefixes look far apart after a few samples is worth settling."""
    coin_flip = settling_gain(RATIO, Prefix(9, 1, 7), Prefix(9, 1, 7), 1.5, 0.5)
    worth_it = settling_gain(RATIO, Prefix(16, 13), Prefix(3, 1, 13), 1.5, 0.5)
    assert coin_flip < 0.05 < 0.15 < worth_it
