"""The threshold protocols of a scoring judge on ProcessBench, on hand-built scores (no model):
the oracle threshold is the best of 10,000 candidates on the subset itself and is the one the
predictions use; scores computed by another tool are a scoring judge like any PRM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepq.trainer.evaluation import processbench as pb
from stepq.trainer.evaluation.judge_spec import JudgeSpec, build_judge


def _one_step_subset(tmp_path: Path, n: int = 2500, wrong: int = 4) -> tuple[Path, Path]:
    """``n`` one-step samples scored 0.6 .. 0.9 in order; the ``wrong`` lowest are erroneous
    (label 0), the rest right (-1): F1 is 100 only between the 4th and 5th scores, a candidate
    a 2,000-point grid over the 2,501 midpoints skips (index 4: int(3 x 1.2505) = 3, then 5)."""
    samples, scores = [], []
    for i in range(n):
        sid = f"s{i}"
        samples.append({"id": sid, "problem": "p", "steps": ["x"], "label": 0 if i < wrong else -1})
        scores.append({"id": sid, "scores": [0.6 + 0.3 * i / n]})
    data, table = tmp_path / "subset.json", tmp_path / "scores.jsonl"
    data.write_text(json.dumps(samples))
    table.write_text("\n".join(json.dumps(s) for s in scores))
    return data, table


def test_the_oracle_threshold_searches_10000_candidates_and_scores_with_the_one_chosen(tmp_path: Path) -> None:
    data, table = _one_step_subset(tmp_path)
    built = build_judge(JudgeSpec(kind="scores", scores_file=table))
    assert built.scoring, "another tool's per-step scores are a scoring judge"
    report = pb.evaluate([data], built.judge, scoring=True, oracle_threshold=True)
    (row,) = report["subsets"]
    assert row["threshold_tuned_on"] == pb.ORACLE and report["threshold_protocol"] == pb.ORACLE
    assert row["f1"] == pytest.approx(100.0), "the one threshold that separates them is found and used"
    lo, hi = 0.6 + 0.3 * 3 / 2500, 0.6 + 0.3 * 4 / 2500
    assert lo < row["threshold"] < hi
    coarse = pb.choose_threshold(
        built.judge.score_samples(pb.load_samples(data)), {f"s{i}": 0 if i < 4 else -1 for i in range(2500)}
    )
    assert not lo < coarse < hi, "a 2,000-point grid misses it: the 10,000 candidates matter here"
    plain = pb.evaluate([data], built.judge, scoring=True, threshold=0.5)
    assert plain["subsets"][0]["f1"] < 100.0, "at the given 0.5 every step is accepted: the oracle's is not it"


def test_scores_from_another_tool_take_a_tuned_threshold_too(tmp_path: Path) -> None:
    data, table = _one_step_subset(tmp_path, n=40, wrong=10)
    built = build_judge(JudgeSpec(kind="scores", scores_file=table))
    tuned = pb.evaluate([data], built.judge, scoring=True, tune_file=data)
    assert tuned["threshold_protocol"] == "one threshold, tuned" and tuned["subsets"][0]["f1"] == pytest.approx(100.0)
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"id": "s0", "scores": [0.9]}))
    with pytest.raises(Exception, match="no row for 39 sample"):
        pb.evaluate([data], build_judge(JudgeSpec(kind="scores", scores_file=short)).judge, scoring=True)


def test_the_oracle_threshold_is_the_best_of_10000_and_predicts_with_it() -> None:
    """The same subset in memory (the one-minute tier): 2,500 one-step samples, F1 100 only
    between the 4th and 5th scores, which a 2,000-point grid skips."""
    n = 2500
    scores: dict[str, list[float | None]] = {f"s{i}": [0.6 + 0.3 * i / n] for i in range(n)}
    labels = {f"s{i}": 0 if i < 4 else -1 for i in range(n)}
    chosen, predictions = pb.at_oracle_threshold(scores, labels)
    assert 0.6 + 0.3 * 3 / n < chosen < 0.6 + 0.3 * 4 / n
    assert predictions == labels, "predicted at the chosen threshold: every sample right"
    assert pb.score("s", labels, predictions).f1 == pytest.approx(100.0)
