"""The judge's verdict parser and rewards, the ProcessBench metric, Best-of-N and chunk-reset
(pure parts, hand-computed cases)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepq.trainer.evaluation import processbench as pb
from stepq.trainer.evaluation.best_of_n import (
    AGGREGATORS,
    Candidate,
    aggregate,
    best_of_n,
    majority,
    pick,
    weighted_vote,
)
from stepq.trainer.evaluation.chunk_reset import PolicyProblem, chunk_reset
from stepq.trainer.evaluation.judges import AcceptAll, LabelOracle, StepItem, SyntheticOracle
from stepq.trainer.generative_judge.prompt import JudgePrompt, parse_verdict, render_judge_prompt
from stepq.trainer.generative_judge.rewards import REWARDS, format_reward, get_rewards, verdict_match
from stepq.workers.backends.base import SamplingParams
from stepq.workers.backends.synthetic import SyntheticBackend
from stepq.workers.backends.synthetic_policy import PROMPT_TEMPLATE, SyntheticPolicy, ground_truth, make_problem
from stepq.workers.data.segmentation import first_chunk
from stepq.workers.seeds import derive_seed
from tests.helpers import DATA

SAMPLE = DATA / "processbench_gsm8k_sample.json"


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("1. Analysis: fine.\n2. Final Judgment: \\boxed{Positive}", True),
        ("2. Final Judgment: \\boxed{ negative }", False),
        ("\\boxed{POSITIVE}", True),
        ("\\boxed {Negative}", False),
        ("I quote \\boxed{Positive} but conclude \\boxed{Negative}", False),
        ("\\boxed{Positive or Negative}", None),
        ("2. Final Judgment: \\boxed{\\text{Positive}}", True),
        ("\\boxed{\\textbf{ Negative }}", False),
        ("\\boxed{\\text{\\textbf{Positive}}}", True),
        ("\\boxed{Negative.}", False),
        ("\\boxed{\\text{Positive}.}", True),
        ("\\boxed{\\text{Positive}} then \\boxed{\\text{Negative}}", False),
        ("\\boxed{\\text{Positive} \\text{Negative}}", None),
        ("\\boxed{Positive", None),
        ("\\boxed{42}", None),
        ("Positive", None),
        ("", None),
    ],
)
def test_verdict_parser(text: str, verdict: bool | None) -> None:
    assert parse_verdict(text) is verdict


def test_prompt_has_problem_history_and_chunk() -> None:
    text = render_judge_prompt("What is 2+2?", ["Step 1: 2.", "Step 2: +2."], "Step 3: = 4.")
    assert text.index("What is 2+2?") < text.index("Step 1: 2.") < text.index("Step 3: = 4.")
    assert "Historical reasoning path" in text and "New reasoning chunk" in text
    assert "\\boxed{Positive}" in text and "\\boxed{Negative}" in text
    assert "first chunk" in render_judge_prompt("q", [], "c")
    with pytest.raises(Exception, match="placeholder"):
        bad = Path(__file__).parent / "data" / "README.md"
        JudgePrompt.load(bad)


def test_rewards_are_a_registry_of_pure_functions() -> None:
    completions = [
        "... \\boxed{Positive}",
        "\\boxed{negative}",
        "no verdict",
        [{"role": "assistant", "content": "\\boxed{Positive}"}],
    ]
    labels = ["Positive", "Positive", "Negative", True]
    assert verdict_match(completions, label=labels) == [1.0, 0.0, 0.0, 1.0]
    good = "1. Analysis: the sum is right.\n2. Final Judgment: \\boxed{Positive}"
    assert format_reward([good, "\\boxed{Positive}", good + " trailing"]) == [1.0, 0.0, 0.0]
    assert set(REWARDS) >= {"verdict-match", "format"}
    assert get_rewards(["verdict-match"]) == [verdict_match]
    with pytest.raises(Exception, match="unknown reward"):
        get_rewards(["nope"])


def test_labels_in_other_spellings_are_read_and_unknown_ones_refused() -> None:
    """A data set's "True" is a positive label (it read as negative, inverting the reward);
    a value no spelling covers is an error naming it, never a silent Negative."""
    from stepq.models.errors import ConfigError
    from stepq.trainer.generative_judge.rewards import label_value

    for positive in ("Positive", "positive ", "True", "true", "1", "yes", "correct", True, 1):
        assert label_value(positive) is True, positive
    for negative in ("Negative", "False", "0", "no", "incorrect", False, 0):
        assert label_value(negative) is False, negative
    good = "1. Analysis: fine. 2. Final Judgment: \\boxed{Positive}"
    assert verdict_match([good, good], label=["True", "False"]) == [1.0, 0.0]
    for bad in ("maybe", "", None, 2, 0.5):
        with pytest.raises(ConfigError, match=repr(bad).replace("(", "\\(").replace(".", "\\.")):
            label_value(bad)


def test_processbench_metric_hand_computed() -> None:
    labels = {"a": 2, "b": 0, "c": -1, "d": -1}
    assert pb.score("t", labels, labels).f1 == 100.0
    always_correct = pb.score("t", labels, {k: -1 for k in labels})
    assert (always_correct.acc_error, always_correct.acc_correct, always_correct.f1) == (0.0, 100.0, 0.0)
    # one of two erroneous right (50%), one of two correct right (50%): F1 = 50
    half = pb.score("t", labels, {"a": 2, "b": 1, "c": -1, "d": 3})
    assert (half.acc_error, half.acc_correct, half.f1) == (50.0, 50.0, 50.0)
    # 100% on errors, 50% on correct: harmonic mean 66.67; unparseable predictions are wrong
    mixed = pb.score("t", labels, {"a": 2, "b": 0, "c": -1, "d": "garbage"})
    assert mixed.f1 == pytest.approx(200 / 3)
    assert pb.score("t", labels, {"a": True, "b": 0, "c": -1, "d": -1}).acc_error == 50.0


def test_predict_stops_at_the_first_negative_and_the_label_oracle_scores_100() -> None:
    samples = pb.load_samples(SAMPLE)
    calls: list[int] = []

    class Counting(LabelOracle):
        def judge(self, items):  # type: ignore[no-untyped-def]
            calls.append(len(items))
            return super().judge(items)

    predictions = pb.predict(Counting(), samples)
    assert predictions == {s["id"]: s["label"] for s in samples}
    assert pb.score("gsm8k", {s["id"]: s["label"] for s in samples}, predictions).f1 == 100.0
    # judged steps: a sample stops at its first negative, so erroneous ones cost label + 1
    expected = sum(s["label"] + 1 if s["label"] != -1 else len(s["steps"]) for s in samples)
    assert sum(calls) == expected
    accept = pb.predict(AcceptAll(), samples)
    assert set(accept.values()) == {-1}
    assert pb.score("g", {s["id"]: s["label"] for s in samples}, accept).f1 == 0.0


def test_predictions_file_and_bad_input(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "x", "prediction": 3}) + "\n\n")
    assert pb.load_predictions(f) == {"x": 3}
    f.write_text("{not json}\n")
    with pytest.raises(Exception, match=r"p.jsonl:1"):
        pb.load_predictions(f)
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps([{"id": "x", "problem": "p", "steps": "not a list", "label": 0}]))
    with pytest.raises(Exception, match="steps"):
        pb.load_samples(bad)


def test_aggregators_and_pick() -> None:
    assert aggregate([0.9, 0.2, 0.8], "min") == 0.2
    assert aggregate([0.5, 1.0], "mean") == 0.75
    assert aggregate([0.5, 0.5], "product") == 0.25
    assert aggregate([0.1, 0.7], "last") == 0.7
    assert aggregate([0.25, 1.0], "geomean") == pytest.approx(0.5)
    assert aggregate([], "min") == 0.0 and set(AGGREGATORS) == {"min", "mean", "product", "last", "geomean", "softmin"}
    assert pick([[1, 0], [1, 1], [1, 1]], "min") == 1  # ties go to the earliest
    c = [Candidate((), "3", False), Candidate((), "4", True), Candidate((), "4", True)]
    assert majority(c) is True
    assert majority([Candidate((), "3", False), Candidate((), "4", True)]) is False  # tie: first seen


def test_best_of_n_hand_computed() -> None:
    right, wrong = Candidate(("s",), "1", True), Candidate(("s",), "2", False)
    problems = [[wrong, right], [right, wrong]]
    scores = [[[0.0], [1.0]], [[1.0], [0.0]]]
    rows = {r.n: r for r in best_of_n(problems, scores, [1, 2], "min")}
    assert rows[1].judge == 50.0 and rows[1].random == 50.0
    assert rows[2].judge == 100.0 and rows[2].random == 50.0


def test_a_weighted_vote_sums_the_judges_scores_by_answer() -> None:
    right, wrong, blank = Candidate(("s",), "5", True), Candidate(("s",), "4", False), Candidate(("s",), None, False)
    # two wrong samples agreeing (0.4 + 0.4) outvote one right sample the judge likes best (0.7)
    three = [[wrong, wrong, right]]
    assert weighted_vote(three[0], [0.4, 0.4, 0.7]) is False
    assert weighted_vote(three[0], [0.4, 0.4, 0.9]) is True  # and not one it likes more than both
    assert weighted_vote([blank, right], [1.0, 0.1]) is True  # no answer, no vote
    assert weighted_vote([blank], [1.0]) is False  # nothing to vote on: the first sample
    # the same scores, chosen the two ways: best takes the right sample, the vote the wrong answer
    scores = [[[0.4, 0.9], [0.5], [0.7]]]
    best = best_of_n(three, scores, [3], "min")[0]
    voted = best_of_n(three, scores, [3], "min", "weighted-vote")[0]
    assert (best.judge, voted.judge, voted.majority, voted.random) == (100.0, 0.0, 0.0, pytest.approx(100 / 3))
    with pytest.raises(ValueError, match="unknown pick"):
        best_of_n(three, scores, [3], "min", "vote")


def test_oracle_judges_synthetic_steps_by_their_truth() -> None:
    policy = SyntheticPolicy(error_rate=0.3, recovery_rate=0.0)
    oracle = SyntheticOracle()
    checked = 0
    for seed in range(30):
        problem = make_problem(seed)
        steps = policy.solve(problem, seed)
        truth = ground_truth(steps)
        texts = [s.text for s in steps]
        items = [StepItem(problem.question, tuple(texts[:i]), texts[i]) for i in range(len(texts))]
        assert oracle.judge(items) == truth
        checked += len(items)
    assert checked > 100


def test_first_chunk() -> None:
    assert first_chunk("Step 1: a.\n\nStep 2: b.\n\n", "\n\n") == ("Step 1: a.\n\n", False)
    assert first_chunk("Step 2: b.\n\n", "\n\n") == ("Step 2: b.\n\n", True)
    assert first_chunk("Step 3: c.\nThe final answer is \\boxed{4}.", "\n\n")[1] is True


def _problems(n: int) -> list[PolicyProblem]:
    out = []
    for i in range(n):
        p = make_problem(derive_seed("cr-test", i))
        out.append(PolicyProblem(PROMPT_TEMPLATE.format(question=p.question), p.question, str(p.answer)))
    return out


def test_chunk_reset_with_accept_all_is_plain_sampling_and_the_oracle_helps() -> None:
    backend = SyntheticBackend(error_rate=0.2, recovery_rate=0.0)
    problems = _problems(60)
    plain = chunk_reset(backend, SamplingParams(), AcceptAll(), problems, max_retries=0)
    accept = chunk_reset(backend, SamplingParams(), AcceptAll(), problems, max_retries=5)
    oracle = chunk_reset(backend, SamplingParams(), SyntheticOracle(), problems, max_retries=5)
    assert accept.solutions == plain.solutions and accept.as_dict() == plain.as_dict()
    assert plain.rejected_chunks == 0 and oracle.rejected_chunks > 0
    assert oracle.accuracy > plain.accuracy + 20
    assert oracle.tokens > plain.tokens
    # every solution is one accepted chunk per operation of its problem
    assert oracle.accepted_chunks == sum(len(make_problem(derive_seed("cr-test", i)).ops) for i in range(60))


def test_chunk_reset_retries_five_times_after_the_first_attempt() -> None:
    """StepWiser: a rejected chunk is regenerated "up to five retries": six draws of a chunk
    that the judge never accepts, the last kept (five attempts in all would be four retries)."""

    class RejectAll:
        name = "reject-all"
        calls = 0

        def judge(self, items: list[StepItem]) -> list[bool | None]:
            self.calls += len(items)
            return [False] * len(items)

    problem = _problems(1)
    for retries in (0, 1, 5):
        judge = RejectAll()
        report = chunk_reset(SyntheticBackend(error_rate=0.2), SamplingParams(), judge, problem, max_retries=retries)
        chunks = report.accepted_chunks
        assert report.forced_chunks == chunks > 0
        assert report.rejected_chunks == retries * chunks
        assert judge.calls == (retries + 1) * chunks


def test_shipped_recipe_follows_the_paper(tmp_path: Path) -> None:
    from trl import GRPOConfig

    from stepq.trainer.training.recipe import Recipe

    recipe = Recipe.load("stepwiser-judge.yaml")  # by name, from any directory
    config = recipe.config(GRPOConfig, tmp_path, bf16=False, activation_checkpointing=False, use_cpu=True)
    assert (config.num_generations, config.learning_rate, config.beta) == (4, 1e-6, 0.0)
    assert (config.epsilon, config.epsilon_high, config.loss_type) == (0.2, 0.28, "grpo")
    assert recipe.rewards == ("verdict-match",)
    with pytest.raises(Exception, match="max_prompt_length"):
        Recipe.parse("model: m\ntrainer:\n  max_prompt_length: 10\n").config(GRPOConfig, tmp_path, use_cpu=True)
    with pytest.raises(Exception, match="unknown key"):
        Recipe.parse("model: m\nlr: 1\n")


def test_threshold_predictions_and_choice() -> None:
    choose_threshold, first_below, predictions_at = pb.choose_threshold, pb.first_below, pb.predictions_at

    assert first_below([0.9, 0.4, 0.1], 0.5) == 1
    assert first_below([0.9, 0.8], 0.5) == -1
    assert first_below([0.9, None, 0.8], 0.5) == 1, "a step with no score is not accepted"
    scores = {"a": [0.9, 0.3, 0.2], "b": [0.8, 0.7], "c": [0.2, 0.9]}
    labels = {"a": 1, "b": -1, "c": 0}
    t = choose_threshold(scores, labels)
    assert predictions_at(scores, t) == {"a": 1, "b": -1, "c": 0}, "a threshold between 0.3 and 0.7 is perfect"
    assert 0.3 < t < 0.7
    # when no threshold is perfect, the chosen one is at least as good as every score's
    noisy = {"a": [0.6, 0.5], "b": [0.55, 0.4], "c": [0.3]}
    noisy_labels = {"a": 1, "b": -1, "c": 0}
    best = choose_threshold(noisy, noisy_labels)
    f1 = pb.score("x", noisy_labels, predictions_at(noisy, best)).f1
    for cand in (0.0, 0.35, 0.45, 0.52, 0.58, 0.7, 1.0):
        assert f1 >= pb.score("x", noisy_labels, predictions_at(noisy, cand)).f1


def test_chunk_reset_accounting_on_a_hand_checked_case() -> None:
    """Two problems, two retries.  Problem 0: its first chunk rejected once, then accepted with
    the final chunk; problem 1: every draw rejected, the third kept anyway (forced).  Tokens are
    each chunk's share of its completion's tokens (a policy that stops at the chunk's end)."""
    from stepq.workers.backends.base import Completion, GenerationRequest

    scripted = {  # (problem, chunk index, attempt) -> (completion text, tokens generated)
        (0, 0, 0): ("a = 3\n\nb = 4\n\n", 10),  # chunk "a = 3\n\n": 7 of 14 characters -> 5 tokens
        (0, 0, 1): ("a = 2\n\nrest\n\n", 12),  # chunk "a = 2\n\n": 7 of 13 -> 6 tokens
        (0, 1, 0): ("\\boxed{7}", 4),  # no blank line: the last chunk, all 4 tokens
        (1, 0, 0): ("z1\n\nmore\n\n", 8),  # 4 of 10 -> 3 tokens
        (1, 0, 1): ("z2\n\nmore\n\n", 8),
        (1, 0, 2): ("z\\boxed{4}", 3),
    }
    seeds = {derive_seed("chunk-reset", 0, *key): key for key in scripted}
    prompts: dict[tuple[int, int, int], str] = {}

    class Scripted:
        name = "scripted"
        generator = "scripted"

        def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
            out = []
            for request in requests:
                key = seeds[request.seeds[0]]
                prompts[key] = request.context
                text, tokens = scripted[key]
                out.append([Completion(text, tokens)])
            return out

        def close(self) -> None:
            pass

    seen: list[StepItem] = []

    class Judge:
        name = "scripted"

        def judge(self, items: list[StepItem]) -> list[bool | None]:
            seen.extend(items)
            return [not (item.chunk.startswith("a = 3") or item.chunk.startswith("z")) for item in items]

    problems = [PolicyProblem("P0:", "q0", "7"), PolicyProblem("P1:", "q1", "5")]
    report = chunk_reset(Scripted(), SamplingParams(), Judge(), problems, max_retries=2)
    assert report.as_dict() == {
        "problems": 2,
        "accuracy": 50.0,
        "accepted_chunks": 3,
        "rejected_chunks": 3,
        "forced_chunks": 1,
        "accepted_tokens": 6 + 4 + 3,
        "rejected_tokens": 5 + 3 + 3,
        "tokens": 24,
    }
    assert report.outcomes == [True, False]
    assert report.solutions == ["a = 2\n\n\\boxed{7}", "z\\boxed{4}"]
    assert set(prompts) == set(scripted), "every attempt drawn once, under its own seed"
    assert prompts[(0, 1, 0)] == "P0:a = 2\n\n", "a rejected chunk never enters the history"
    assert [item.history for item in seen if item.problem == "q0"] == [(), (), ("a = 2\n\n",)]
