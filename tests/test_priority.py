"""Priority strategies as pure functions, on hand-computed values, and their spelling."""

from __future__ import annotations

import pytest

from stepq.models.errors import ConfigError
from stepq.models.jobs import take_in_turn
from stepq.workers.priority.strategies import (
    Strategy,
    convincing_wrong,
    dispatch_key,
    parse_strategy,
    priority,
    random_priority,
    solution_score,
    uncertainty,
)


def test_uncertainty_is_the_chunk_nearest_the_threshold() -> None:
    assert uncertainty([0.9, 0.6]) == pytest.approx(0.8)  # 0.6 is 0.1 from 0.5: 1 - 0.1 / 0.5
    assert uncertainty([1.0, 0.0]) == 0.0
    assert uncertainty([0.5]) == 1.0
    # an asymmetric threshold scales each side by the wider one: |p - 0.3| / 0.7
    assert uncertainty([0.3], 0.3) == 1.0
    assert uncertainty([1.0], 0.3) == pytest.approx(0.0)
    assert uncertainty([0.0], 0.3) == pytest.approx(1 - 0.3 / 0.7)
    assert uncertainty([0.95, None]) == 1.0, "an unscored chunk is undecided"
    assert uncertainty([]) == 0.0


def test_convincing_wrong_rates_the_judge_against_the_answer() -> None:
    assert solution_score([0.9, 0.8, None]) == 0.8
    assert convincing_wrong([0.9, 0.8], outcome=False) == pytest.approx(0.8), "a wrong answer rated highly"
    assert convincing_wrong([0.9, 0.3], outcome=False) == pytest.approx(0.3), "a wrong answer caught: less"
    assert convincing_wrong([0.9, 0.1], outcome=True) == 0.0, "PRM800K's strategy: right answers get nothing"
    assert convincing_wrong([0.9], outcome=None) == 0.0
    assert convincing_wrong([None], outcome=False) == 0.0


def test_convincing_wrong_with_its_mirror_rates_right_answers_rated_low() -> None:
    assert convincing_wrong([0.9, 0.8], outcome=True, mirror=True) == pytest.approx(0.2), "rated highly: no news"
    assert convincing_wrong([0.9, 0.1], outcome=True, mirror=True) == pytest.approx(0.9), "a right answer rated low"
    assert convincing_wrong([0.9, 0.8], outcome=False, mirror=True) == pytest.approx(0.8), "wrong answers as without"
    mirrored = parse_strategy("convincing-wrong:run=1,mirror=yes")
    assert priority(mirrored, 7, [0.9, 0.1], True) == pytest.approx(0.9)
    assert priority(parse_strategy("convincing-wrong:run=1"), 7, [0.9, 0.1], True) == 0.0


def test_random_priority_is_fixed_by_seed_and_trajectory() -> None:
    draws = [random_priority(3, t) for t in range(200)]
    assert all(0.0 <= d < 1.0 for d in draws)
    assert draws == [random_priority(3, t) for t in range(200)]
    assert draws != [random_priority(4, t) for t in range(200)]
    assert 0.4 < sum(draws) / len(draws) < 0.6


def test_priority_dispatches_by_strategy() -> None:
    scores = [0.9, 0.55]
    assert priority(parse_strategy("fifo"), 7, scores, False) == 0.0
    assert priority(parse_strategy("uncertainty:run=1"), 7, scores, False) == pytest.approx(0.9)
    assert priority(parse_strategy("convincing-wrong:run=1"), 7, scores, False) == pytest.approx(0.55)
    assert priority(parse_strategy("random:seed=2"), 7, scores, False) == random_priority(2, 7)


def test_aging_bounds_how_far_a_priority_moves_work_ahead() -> None:
    assert dispatch_key(1000.0, 0.0, 100.0) == 1000.0
    assert dispatch_key(1000.0, 1.0, 100.0) == 900.0
    old_and_unwanted = dispatch_key(800.0, 0.0, 100.0)
    new_and_wanted = dispatch_key(1000.0, 1.0, 100.0)
    assert old_and_unwanted < new_and_wanted, "work planned an aging period earlier goes first"


def test_strategies_are_spelled_one_way() -> None:
    assert parse_strategy("uncertainty:run=3").key == "uncertainty:run=3"
    assert parse_strategy(" convincing-wrong: lineage=judge ,votes=8").key == "convincing-wrong:lineage=judge,votes=8"
    assert parse_strategy("random").key == "random"
    assert parse_strategy("random:seed=7") == Strategy("random", seed=7)
    assert parse_strategy("uncertainty:run=1,threshold=0.3").threshold == 0.3
    logprob = parse_strategy("uncertainty:run=1,score=logprob")
    assert (logprob.score, logprob.key) == ("logprob", "uncertainty:run=1,score=logprob")
    assert parse_strategy(logprob.key) == logprob
    mirrored = parse_strategy("convincing-wrong:mirror=yes,run=2")
    assert (mirrored.mirror, mirrored.key) == (True, "convincing-wrong:run=2,mirror=yes")
    assert parse_strategy("convincing-wrong:run=2,mirror=no").key == "convincing-wrong:run=2"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("loudest", "unknown priority strategy"),
        ("uncertainty", "needs a judge"),
        ("uncertainty:run=1,lineage=j", "needs a judge"),
        ("random:run=1", "takes no option run"),
        ("uncertainty:run=x", "invalid literal"),
        ("uncertainty:run=1,votes=0", "votes must be >= 1"),
        ("uncertainty:run=1,threshold=1", "threshold strictly between"),
        ("uncertainty:run", "not KEY=VALUE"),
        ("uncertainty:run=1,score=loudness", "score 'loudness' is not one of"),
        ("random:score=logprob", "takes no option score"),
        ("uncertainty:run=1,mirror=yes", "takes no option mirror"),
        ("convincing-wrong:run=1,mirror=maybe", "mirror is yes or no"),
    ],
)
def test_a_bad_strategy_is_a_configuration_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_strategy(text)


def test_sets_take_turns() -> None:
    assert take_in_turn([[1, 2, 3], [10], [20, 21]], 10) == [1, 10, 20, 2, 21, 3]
    assert take_in_turn([[1, 2, 3], [10], [20, 21]], 4) == [1, 10, 20, 2]
    assert take_in_turn([[], []], 5) == []
