"""bench_judge_at_work: the Best-of-N bookkeeping on hand-made samples, and the whole chain at tiny size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.experiments.bench_judge_at_work import best_of_n_rows, paired_gain

ROOT = Path(__file__).resolve().parents[1]


def _sample(steps: list[str], answer: str, correct: bool) -> dict:
    return {"steps": tuple(steps), "answer": answer, "correct": correct}


def test_best_of_n_picks_by_the_lowest_step_score_and_votes_by_answer() -> None:
    problems = [("q1", "5"), ("q2", "7")]
    candidates = [
        # q1: two wrong samples agreeing on 4, one right; its bad step is scored low
        [_sample(["a", "bad"], "4", False), _sample(["a", "b"], "5", True), _sample(["c", "bad"], "4", False)],
        # q2: right first; majority right too
        [_sample(["x"], "7", True), _sample(["bad"], "6", False), _sample(["x"], "7", True)],
    ]

    def likes_good_steps(items: list) -> list[float]:
        return [0.1 if item.chunk == "bad" else 0.9 for item in items]

    def likes_bad_steps(items: list) -> list[float]:
        return [0.9 if item.chunk == "bad" else 0.1 for item in items]

    rows = best_of_n_rows(problems, candidates, {"good": likes_good_steps, "inverted": likes_bad_steps}, [1, 3], 0)
    one, three = rows
    # N = 1: every strategy takes the first sample
    assert {one[k]["accuracy"] for k in ("good", "inverted", "majority", "random")} == {50.0}
    assert three["good"]["accuracy"] == 100.0  # the right sample has no low step on either problem
    assert three["inverted"]["accuracy"] == 0.0  # an inverted judge picks the wrong ones
    assert three["majority"]["accuracy"] == 50.0  # q1's majority answer (4) is wrong
    assert three["outcomes"]["good"] == [True, True]


def _candidate(answer: str | None, correct: bool) -> Any:
    from stepq.trainer.evaluation.best_of_n import Candidate

    return Candidate(("step",), answer, correct)


def test_a_wrong_pick_is_read_as_tied_saturated_missed_or_outscored() -> None:
    from bench.experiments.best_of_n_reading import why_wrong

    wrong, right = _candidate("4", False), _candidate("5", True)
    clean, slipped = [1.0, 1.0], [1.0, 0.0]  # the truth: every step right; the second step wrong
    assert why_wrong([right, wrong], [[0.9, 0.8], [0.9, 0.7]], [clean, slipped]) is None
    # level with a right sample that comes later: lost on the tie rule, not on the scores
    assert why_wrong([wrong, right], [[0.9, 0.8], [0.8, 0.9]], [slipped, clean]) == "tied"
    # the wrong pick's probability has run out of digits; the right one has not
    assert why_wrong([right, wrong], [[1.0, 0.99], [1.0, 1.0]], [clean, slipped]) == "saturated"
    # the judge accepts the step the truth rejects
    assert why_wrong([right, wrong], [[0.9, 0.6], [0.9, 0.7]], [clean, slipped]) == "missed"
    # after the first wrong step the truth rejects every step: only the first one is a miss
    early, dead = [1.0, 0.0, 0.0], [0.9, 0.3, 0.9]
    assert why_wrong([right, wrong], [[0.9, 0.2], dead], [clean, early]) == "outscored"
    assert why_wrong([right, wrong], [[0.9, 0.2], [0.9, 0.9, 0.3]], [clean, early]) == "missed"
    # the judge rejects the wrong step, but rejects a step of the right sample harder
    assert why_wrong([right, wrong], [[0.9, 0.1], [0.9, 0.3]], [clean, slipped]) == "outscored"


def test_first_accepted_takes_the_earliest_sample_accepted_whole_and_the_reading_counts_each_pick() -> None:
    from bench.experiments.best_of_n_reading import first_accepted, read_picks

    three = [_candidate("4", False), _candidate("4", False), _candidate("5", True)]
    # the first sample whose every step is accepted (>= 0.5), whatever comes after it
    assert first_accepted(three, [[0.9, 0.4], [0.6, 0.5], [1.0, 1.0]]) is False
    # none accepted whole: the one accepted longest before its first rejection
    assert first_accepted(three, [[0.9, 0.4], [0.1, 0.9], [0.9, 0.9, 0.2]]) is True
    truth = [[[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]]]
    read = read_picks([three], [[[0.9, 0.4], [0.6, 0.5], [1.0, 1.0]]], truth, 3)
    assert read["accuracy"] == {"lowest step P(Positive)": 100.0, "first accepted": 0.0, "weighted vote": 100.0}
    assert read["wrong_samples"] == {"saturated": 0.0, "accepted": 50.0, "lowest_quartiles": [0.4, 0.5, 0.5]}
    assert read["right_samples"] == {"saturated": 100.0, "accepted": 100.0, "lowest_quartiles": [1.0, 1.0, 1.0]}
    assert read_picks([three], [[[0.9, 0.4], [0.6, 0.5], [1.0, 1.0]]], truth, 4)["problems"] == 0


def test_kept_scores_read_again_as_when_they_were_scored(tmp_path: Path) -> None:
    from bench.experiments.best_of_n_reading import load_scores, read_rows, save_scores
    from stepq.trainer.evaluation.best_of_n import best_of_n

    problems = [[_candidate("4", False), _candidate("5", True)], [_candidate("7", True), _candidate("6", False)]]
    scores = [[[0.9, 0.8], [0.7]], [[0.2], [0.6, 0.9]]]
    truth = [[[1.0, 0.0], [1.0]], [[1.0], [0.0, 0.0]]]
    save_scores(tmp_path / "scores.json", problems, scores, truth)
    kept, kept_scores, kept_truth = load_scores(tmp_path / "scores.json")
    again = read_rows(kept, kept_scores, kept_truth, best_of_n(kept, kept_scores, [2], "min"), 0)
    assert again == read_rows(problems, scores, truth, best_of_n(problems, scores, [2], "min"), 0)
    # both picks are wrong, each on a wrong step the judge accepts; majority vote (the first
    # answer on a tie) is wrong on the first problem and right on the second
    assert again[0]["wrong_picks"] == {"tied": 0, "saturated": 0, "missed": 2, "outscored": 0}
    assert again[0]["over_majority"]["lowest step P(Positive)"]["gain"] == -50.0


def test_paired_gain_counts_problems_won_and_lost() -> None:
    plain = [False, False, True, True]
    judged = [True, False, True, False]
    gain = paired_gain(plain, judged, 0)
    assert gain["gain"] == 0.0 and gain["ci"][0] < 0 < gain["ci"][1]
    assert paired_gain(plain, [True, True, True, True], 0)["gain"] == 50.0


def _quick(module: str, *args: str) -> dict[str, Any]:
    """A benchmark's ``--quick`` run as a real process: its JSON result."""
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", f"bench.experiments.{module}", "--quick", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
@pytest.mark.timeout(600)  # 107 s on two workers, ~90 s more where its fixture builds the quick policy (2026-12-07)
def test_the_chain_runs_at_tiny_size(quick_policies: Path) -> None:
    result = _quick("bench_judge_at_work", "--policy-cache", str(quick_policies))
    runs = result["chunk_reset"]
    assert set(runs) == {"plain", "judge", "oracle"}
    assert runs["plain"]["rejected_chunks"] == 0 and runs["plain"]["problems"] == result["problems"]
    for name in ("judge", "oracle"):
        assert runs[name]["tokens_over_plain"] == runs[name]["tokens"] / runs["plain"]["tokens"]
        assert len(runs[name]["outcomes"]) == result["problems"]
    assert [row["n"] for row in result["best_of_n"]] == [1, 2]


@pytest.mark.slow
def test_the_judge_at_work_on_its_own_policy_runs_through_stepq_evals_functions() -> None:
    result = _quick("judge_own_policy")
    runs = result["chunk_reset"]
    assert runs["plain"]["rejected_chunks"] == 0 and runs["plain"]["problems"] == result["problems"] == 4
    for name in ("judge", "oracle"):
        assert len(runs[name]["outcomes"]) == 4
        gained = 100.0 * (sum(runs[name]["outcomes"]) - sum(runs["plain"]["outcomes"])) / 4
        assert runs[name]["gain_over_plain"]["gain"] == gained
    for row in result["best_of_n"]:
        assert row["problems"] == 4
        assert {"judge P(Positive)", "majority", "random", "oracle"} <= set(row)
    assert [row["n"] for row in result["best_of_n"]] == [1, 2]
    first = result["best_of_n"][0]
    assert first["judge P(Positive)"]["accuracy"] == first["random"]["accuracy"] == first["majority"]["accuracy"]
    for row in result["best_of_n"]:  # the reading is of the same scores as the pick
        reading = row["reading"]
        wrong = 100.0 - row["judge P(Positive)"]["accuracy"]
        assert reading["accuracy"]["lowest step P(Positive)"] == row["judge P(Positive)"]["accuracy"]
        assert sum(reading["wrong_picks"].values()) == round(wrong * row["problems"] / 100)


def test_the_own_policy_goal_needs_half_the_oracles_gain_clear_of_zero_on_every_seed() -> None:
    from bench.experiments.judge_own_policy import summary

    def run(seed: int, judge: tuple[float, float, float], oracle: float) -> dict[str, Any]:
        gain = {"gain": judge[0], "ci": [judge[1], judge[2]]}
        return {
            "seed": seed,
            "chunk_reset": {
                "plain": {"accuracy": 50.0},
                "judge": {"accuracy": 50.0 + judge[0], "gain_over_plain": gain, "tokens_over_plain": 2.0},
                "oracle": {"accuracy": 50.0 + oracle, "gain_over_plain": {"gain": oracle, "ci": [1.0, 2.0]}},
            },
            "best_of_n": [{"n": 4, "judge_over_majority": {"gain": 1.0, "ci": [0.0, 2.0]}}],
        }

    met = summary([run(1, (25.0, 10.0, 40.0), 40.0), run(0, (20.0, 2.0, 38.0), 40.0)])
    assert [r["seed"] for r in met["seeds"]] == [0, 1] and met["goal_every_seed"]
    assert met["seeds"][0]["share_of_oracle"] == 0.5 and met["mean"]["judge"] == 72.5
    assert not summary([run(0, (19.0, 2.0, 38.0), 40.0)])["goal_every_seed"], "below half the oracle's gain"
    assert not summary([run(0, (30.0, -1.0, 50.0), 40.0)])["goal_every_seed"], "interval not clear of zero"
