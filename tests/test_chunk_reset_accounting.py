"""Chunk-reset's accounting on a case checked by hand: a scripted policy (a stand-in whose
drafts are written out below) and a scripted judge, so that every attempt, token and final
answer can be counted on paper."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from stepq.trainer.evaluation.chunk_reset import PolicyProblem, chunk_reset
from stepq.trainer.evaluation.judges import StepItem
from stepq.workers.backends.base import Completion, GenerationRequest, SamplingParams

# Each context's drafts, in the order a retry from that context receives them; a draft's
# tokens are its characters, so a chunk's tokens are its length.
DRAFTS = {
    "A:": ["Step 1: 3 + 3 = 7.\n\nStep 2: x", "Step 1: 3 + 4 = 7.\n\nStep 2: y"],
    "A:Step 1: 3 + 4 = 7.\n\n": ["So \\boxed{7}."],
    "A:Step 1: 3 + 3 = 7.\n\n": ["So \\boxed{6}."],
    "B:": ["So \\boxed{4}.", "So \\boxed{16}.", "So \\boxed{5}."],
    "C:": [""],
}


@dataclass
class ScriptedPolicy:
    """Stand-in for a generation engine: each call from a context returns its next draft."""

    name: str = "scripted"
    calls: dict[str, int] = field(default_factory=dict)

    @property
    def generator(self) -> str:
        return "scripted"

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
        out = []
        for r in requests:
            k = self.calls.get(r.context, 0)
            self.calls[r.context] = k + 1
            text = DRAFTS[r.context][k]
            out.append([Completion(text, len(text))])
        return out

    def close(self) -> None:
        pass


@dataclass
class ScriptedJudge:
    """No verdict for A's first draft, rejects everything of B's, accepts the rest."""

    name: str = "scripted"
    asked: list[str] = field(default_factory=list)

    def judge(self, items: Sequence[StepItem]) -> list[bool | None]:
        self.asked += [i.chunk for i in items]
        return [None if i.chunk.startswith("Step 1: 3 + 3") else not i.problem.startswith("B") for i in items]


def test_attempts_tokens_and_answers_add_up_as_counted_by_hand() -> None:
    problems = [PolicyProblem("A:", "A", "7"), PolicyProblem("B:", "B", "5"), PolicyProblem("C:", "C", "1")]
    policy, judge = ScriptedPolicy(), ScriptedJudge()
    report = chunk_reset(policy, SamplingParams(), judge, problems, max_retries=2)

    # A: its first draft has no verdict and is drawn again (20 tokens: "Step 1: 3 + 3 = 7.\n\n"),
    # the second is accepted (20), then the answer chunk (13, the last: it is the whole draft).
    # B: three drafts of one chunk (13, 14 and 13 tokens), each rejected; after two retries the
    # third is kept, forced. C: the policy stops at once: no chunk, nothing asked of the judge.
    assert report.solutions == ["Step 1: 3 + 4 = 7.\n\nSo \\boxed{7}.", "So \\boxed{5}.", ""]
    assert report.outcomes == [True, True, False] and report.correct == 2
    assert report.as_dict() == {
        "problems": 3,
        "accuracy": 66.667,
        "accepted_chunks": 3,  # A's two and B's forced one
        "rejected_chunks": 3,  # A's first, B's first two
        "forced_chunks": 1,
        "accepted_tokens": 20 + 13 + 13,
        "rejected_tokens": 20 + 13 + 14,
        "tokens": 93,
    }
    assert policy.calls == {"A:": 2, "A:Step 1: 3 + 4 = 7.\n\n": 1, "B:": 3, "C:": 1}
    assert len(judge.asked) == 6 and "" not in judge.asked  # every draft but C's empty one


def test_without_retries_the_same_drafts_are_plain_sampling() -> None:
    """max_retries=0 keeps every first draft whatever the verdict: the baseline's accounting."""
    problems = [PolicyProblem("A:", "A", "7"), PolicyProblem("B:", "B", "5")]
    report = chunk_reset(ScriptedPolicy(), SamplingParams(), ScriptedJudge(), problems, max_retries=0)
    assert report.solutions == ["Step 1: 3 + 3 = 7.\n\nSo \\boxed{6}.", "So \\boxed{4}."]
    assert report.outcomes == [False, False]
    assert (report.rejected_chunks, report.rejected_tokens) == (0, 0)
    assert (report.accepted_chunks, report.accepted_tokens) == (3, 20 + 13 + 13)
    assert report.forced_chunks == 2  # A's first draft (no verdict) and B's (rejected), kept as drawn
