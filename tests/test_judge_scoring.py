"""A generative judge as a scorer (P(Positive) by votes or at the verdict's log-probability),
what every evaluation counts of a judge's outputs, and the ProcessBench command's inputs
(several files after one --data; a predictions file that misses samples)."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from stepq.cli import main
from stepq.trainer.evaluation import processbench as pb
from stepq.trainer.evaluation.judges import GenerativeScorer, ModelJudge, StepItem
from stepq.trainer.generative_judge.prompt import JudgePrompt
from stepq.workers.backends.base import Completion, GenerationRequest, SamplingParams
from tests.helpers import DATA

SAMPLE = DATA / "processbench_gsm8k_sample.json"
TEMPLATE = JudgePrompt("{problem}|{history}|{chunk}")


@dataclass
class ScriptedJudgeBackend:
    """A stand-in for a judge model (named so): answer i of a chunk says Positive iff
    i < the number of "+" in the chunk; a chunk with "?" gets an answer cut at the limit
    with no verdict.  The counting and scoring around it are what is tested."""

    name: str = "scripted"
    generator: str = "scripted"

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
        out = []
        for request in requests:
            chunk = request.context.rsplit("|", 1)[-1]
            row = []
            for i in range(request.n):
                if "?" in chunk:
                    row.append(Completion("1. Analysis: hmm", params.max_tokens, "length"))
                else:
                    word = "Positive" if i < chunk.count("+") else "Negative"
                    row.append(Completion(f"2. Final Judgment: \\boxed{{{word}}}", 9, "stop"))
            out.append(row)
        return out

    def close(self) -> None:
        return None


def _judge(votes: int) -> ModelJudge:
    return ModelJudge(ScriptedJudgeBackend(), SamplingParams(max_tokens=7), TEMPLATE, votes=votes)


def test_votes_score_and_counts() -> None:
    items = [StepItem("q", (), c) for c in ("++++", "+++", "+", "", "?")]
    scorer = GenerativeScorer(_judge(votes=4), "votes")
    assert scorer.scores(items) == [1.0, 0.75, 0.25, 0.0, 0.0]
    assert scorer.stats.as_dict() == {"judge_outputs": 20, "no_verdict": 4, "truncated": 4, "undecided_chunks": 0}
    # as a judge it accepts at its threshold (--threshold), not at a fixed 0.5
    strict = GenerativeScorer(_judge(votes=4), "votes", threshold=0.75)
    assert strict.judge(items) == [True, True, False, False, False]
    judge = _judge(votes=4)
    # majority of 4: 3 of 4 accepts, 1 of 4 rejects, 2 of 4 and no verdict at all are undecided
    assert judge.judge([StepItem("q", (), c) for c in ("+++", "+", "++", "?")]) == [True, False, None, None]
    assert judge.stats.undecided == 2 and judge.stats.no_verdict == 4


def test_a_generative_scorer_takes_a_tuned_threshold() -> None:
    """Greedy verdicts reject the 1-in-4 steps; P(Positive) with a threshold tuned on other
    samples finds the first step below it."""
    tune = [
        {"id": "t1", "problem": "p", "steps": ["++++", "+++", "+"], "label": 2},
        {"id": "t2", "problem": "p", "steps": ["++++", "++++"], "label": -1},
        {"id": "t3", "problem": "p", "steps": ["+", "++++"], "label": 0},
    ]
    test = [
        {"id": "a", "problem": "p", "steps": ["+++", "++++", "", "++"], "label": 2},
        {"id": "b", "problem": "p", "steps": ["++++", "+++"], "label": -1},
    ]
    scorer = GenerativeScorer(_judge(votes=4), "votes")
    scores = pb.sample_scores(scorer, tune)
    assert scores["t1"] == [1.0, 0.75, 0.25]
    threshold = pb.choose_threshold(scores, {s["id"]: s["label"] for s in tune})
    assert 0.25 < threshold <= 0.75
    predicted = pb.predictions_at(pb.sample_scores(scorer, test), threshold)
    assert predicted == {"a": 2, "b": -1}


@pytest.mark.slow
def test_logprob_score_reads_the_model_at_the_verdict(tmp_path: Path) -> None:
    from stepq.trainer.tiny_model import build_tiny_model
    from stepq.workers.backends.hf import HFBackend

    backend = HFBackend(str(build_tiny_model(tmp_path / "m", seed=3)))
    # the chain rule holds: log P(ab | c) = log P(a | c) + log P(b | ca)
    ab, a, b = backend.continuation_logprobs([("ctx: ", "Po"), ("ctx: ", "P"), ("ctx: P", "o")])
    assert ab == pytest.approx(a + b, abs=1e-4) and ab < a < 0
    judge = ModelJudge(backend, SamplingParams(temperature=0.0, max_tokens=6), TEMPLATE, chat_template=False)
    scorer = GenerativeScorer(judge, "logprob")
    items = [StepItem("2+2", (), "4"), StepItem("2+2", ("4",), "5")]
    scores = scorer.scores(items)
    assert all(0.0 < s < 1.0 for s in scores)
    # the same number from the model directly: the analysis had no box, so the verdict opening was appended
    ((prompt, (answer, *_)),) = judge.answers(items[:1])
    assert "\\boxed{" not in answer.text  # a random model writes no box: the opening is appended
    prefix = prompt + answer.text + "\n2. Final Judgment: \\boxed{"
    pos, neg = backend.continuation_logprobs([(prefix, "Positive"), (prefix, "Negative")])
    assert scores[0] == pytest.approx(1 / (1 + math.exp(neg - pos)), abs=1e-6)
    from stepq.models.errors import GenerationError

    window = backend.context_window
    assert window is not None  # a context past the model's positions indexed out of range: said so
    with pytest.raises(GenerationError, match=f"do not fit the model's window of {window}") as past:
        backend.continuation_logprobs([("x" * window, "Positive")])
    assert past.value.permanent


def test_processbench_takes_several_files_and_checks_predictions(tmp_path: Path) -> None:
    second = tmp_path / "second.json"
    shutil.copyfile(SAMPLE, second)
    runner = CliRunner()
    both = runner.invoke(
        main, ["eval", "processbench", "--data", str(SAMPLE), str(second), "--judge", "label-oracle", "--json"]
    )
    assert both.exit_code == 0, both.output
    report = json.loads(both.output)
    assert [s["subset"] for s in report["subsets"]] == [SAMPLE.stem, "second"]
    assert all(s["f1"] == 100.0 for s in report["subsets"]) and report["average_f1"] == 100.0

    samples = json.loads(SAMPLE.read_text())
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(json.dumps({"id": s["id"], "prediction": s["label"]}) + "\n" for s in samples[:-2]))
    missing = runner.invoke(main, ["eval", "processbench", "--data", str(SAMPLE), "--predictions", str(partial)])
    assert missing.exit_code == 3, missing.output
    assert f"2 of {len(samples)} samples have no prediction" in missing.output
    partial.write_text("".join(json.dumps({"id": s["id"], "prediction": s["label"]}) + "\n" for s in samples))
    whole = runner.invoke(main, ["eval", "processbench", "--data", str(SAMPLE), "--predictions", str(partial)])
    assert whole.exit_code == 0 and "100.0" in whole.output
    # a quick look: the first samples of each file, said so; predictions past them are not asked for
    partial.write_text("".join(json.dumps({"id": s["id"], "prediction": s["label"]}) + "\n" for s in samples[:3]))
    quick = ["eval", "processbench", "--data", str(SAMPLE), str(second), "--predictions", str(partial), "--limit", "3"]
    looked = runner.invoke(main, [*quick[:5], "--judge", "label-oracle", "--limit", "3", "--json"])
    assert looked.exit_code == 0, looked.output
    report = json.loads(looked.output)
    assert report["limit"] == 3 and [s["samples"] for s in report["subsets"]] == [3, 3]
    shown = runner.invoke(main, quick[:4] + quick[5:])
    assert shown.exit_code == 0 and "the first 3 samples of each file only" in shown.output, shown.output


@dataclass
class TaggedPolicy:
    """A stand-in policy (named so) that writes ``<chunk>`` tags with blank lines inside
    chunks: the rest of its fixed solution from wherever the context stops."""

    solution: str
    name: str = "tagged"
    generator: str = "tagged"

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
        out = []
        for r in requests:
            done = r.context.split("PROMPT:", 1)[1]
            rest = self.solution[len(done) :]
            out.append([Completion(rest, len(rest), "stop") for _ in r.seeds])
        return out

    def close(self) -> None:
        return None


@dataclass
class RecordingJudge:
    seen: list[str]
    name: str = "recording"

    def judge(self, items: Sequence[StepItem]) -> list[bool | None]:
        self.seen += [i.chunk for i in items]
        return [True for _ in items]


def test_chunk_reset_cuts_candidates_with_the_sets_segmentation() -> None:
    from stepq.trainer.evaluation.chunk_reset import PolicyProblem, chunk_reset
    from stepq.workers.data.segmentation import segment

    solution = "<chunk>First, 2 + 3.\n\nThat is 5.</chunk>\n<chunk>So the answer is \\boxed{5}.</chunk>"
    trained_on = list(segment(solution, "chunk-tags").chunks)
    judge = RecordingJudge([])
    problem = PolicyProblem("PROMPT:", "What is 2 + 3?", "5", segmentation="chunk-tags")
    report = chunk_reset(TaggedPolicy(solution), SamplingParams(), judge, [problem])
    assert judge.seen == trained_on and len(trained_on) == 2  # not cut at the blank line inside chunk 1
    assert report.correct == 1 and report.solutions == [solution]
    blank = RecordingJudge([])
    chunk_reset(TaggedPolicy(solution), SamplingParams(), blank, [PolicyProblem("PROMPT:", "q", "5")])
    assert blank.seen[0] == "<chunk>First, 2 + 3.\n\n"  # what the old cut gave the judge
