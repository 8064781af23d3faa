"""Label rules and Q-value bookkeeping, exhaustively on a grid of Q-values."""

from __future__ import annotations

import itertools

import pytest

from stepq.models.errors import ConfigError
from stepq.workers.labelling.labels import abs_q, best_of_4, label_chunks, parse_rule, rel_effective, rel_ratio
from stepq.workers.labelling.qvalues import QEstimate, estimates, rollout_counts

GRID = [i / 16 for i in range(17)]


def test_abs_q_is_positive_iff_q_after_is_positive() -> None:
    for before, after in itertools.product(GRID, GRID):
        assert abs_q(before, after) == (after > 0)


def test_rel_ratio_on_the_grid() -> None:
    for before, after in itertools.product(GRID, GRID):
        expected = after > 0 if before == 0 else after / before > 0.8
        assert rel_ratio(before, after) == expected


@pytest.mark.parametrize(
    ("before", "after", "gamma", "positive"),
    [
        (0.0, 0.0, 0.8, False),  # dead stays dead
        (0.0, 0.25, 0.8, True),  # reviving a dead prefix is progress
        (0.5, 0.4, 0.8, False),  # exactly at the threshold is not above it
        (0.5, 0.41, 0.8, True),
        (0.5, 0.5, 1.0, False),  # gamma 1.0 demands strict improvement
        (0.5, 0.75, 1.2, True),
        (1.0, 0.0, 0.6, False),
    ],
)
def test_rel_ratio_edges(before: float, after: float, gamma: float, positive: bool) -> None:
    assert rel_ratio(before, after, gamma) is positive


def test_best_of_4() -> None:
    assert best_of_4(0.0) == 0.0 and best_of_4(1.0) == 1.0
    assert best_of_4(0.5) == pytest.approx(1 - 0.5**4)


def test_rel_effective_on_the_grid() -> None:
    for before, after in itertools.product(GRID, GRID):
        value = after + 0.4 * ((1 - (1 - after) ** 4) - (1 - (1 - before) ** 4))
        assert rel_effective(before, after) == (value > 0)
    assert rel_effective(0.0, 0.0) is False
    assert rel_effective(1.0, 0.0) is False
    # a small drop is tolerated at alpha 0.4 but not at 0.8 (0.125 - 0.27 alpha)
    assert rel_effective(0.25, 0.125, alpha=0.4) is True
    assert rel_effective(0.25, 0.125, alpha=0.8) is False


def test_parse_rule() -> None:
    assert parse_rule("abs-q").key == "abs-q"
    assert parse_rule("rel-ratio").key == "rel-ratio:gamma=0.8"
    assert parse_rule("Rel-Ratio:gamma=0.7").key == "rel-ratio:gamma=0.7"
    assert parse_rule("rel-effective:alpha=0.8").params == {"alpha": 0.8}
    for bad in ["nope", "rel-ratio:beta=1", "rel-ratio:gamma=x", "rel-ratio:gamma=nan"]:
        with pytest.raises(ConfigError):
            parse_rule(bad)


def test_label_chunks_needs_known_q_values() -> None:
    assert label_chunks(parse_rule("abs-q"), [None, 0.5, 0.0, None, 1.0]) == [True, False, None, True]
    assert label_chunks(parse_rule("rel-ratio"), [None, 0.5, 0.5, 0.0]) == [None, True, False]
    assert label_chunks(parse_rule("rel-ratio"), [1.0, 0.5, 0.5]) == [False, True]


def test_estimates_and_counts() -> None:
    ests = estimates({0: (4, 2), 1: (2, 2), 2: (4, 0)}, n_chunks=2, outcome=True)
    assert ests == [QEstimate(0, 4, 2, "rollouts"), QEstimate(1, 2, 2, "rollouts"), QEstimate(2, 1, 1, "outcome")]
    assert [e.q for e in ests] == [0.5, 1.0, 1.0]
    assert rollout_counts({0: {0: 1, 1: 0, 5: 1}, 1: {}}, m=4) == {0: (2, 1), 1: (0, 0)}
