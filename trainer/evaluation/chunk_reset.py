"""Chunk-reset inference (StepWiser): the policy writes one chunk at a time, the judge checks
it, and a rejected chunk is discarded and regenerated from the same prefix, "up to five
retries" (StepWiser): ``max_retries`` regenerations after the first attempt, so six attempts
in all by default; the last attempt is kept whatever the verdict.

Attempt a of chunk k of problem p is always the same seeded draw, so with a judge that
accepts everything (or ``max_retries=0``) the result is exactly plain chunk-by-chunk
sampling: the baseline it is compared with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stepq.trainer.evaluation.judges import StepItem, StepJudge
from stepq.workers.backends.base import GenerationBackend, GenerationRequest, SamplingParams
from stepq.workers.data.segmentation import first_chunk, next_chunk
from stepq.workers.grading.grader import Grader
from stepq.workers.seeds import derive_seed


@dataclass(frozen=True)
class PolicyProblem:
    prompt: str
    """The policy prompt; the solution so far is appended to it as a raw completion."""
    question: str
    reference: str
    segmentation: str | None = None
    """How the policy's text is cut into chunks (the set's own method, so candidates are the
    chunks its judge was trained on); None: at the first blank line."""


@dataclass
class ChunkResetReport:
    problems: int = 0
    correct: int = 0
    accepted_chunks: int = 0
    rejected_chunks: int = 0
    forced_chunks: int = 0
    """Chunks kept after the last attempt was rejected too."""
    accepted_tokens: int = 0
    """Tokens of the kept chunks: each chunk's share (by characters) of the tokens its output
    took, the rest of that output being discarded (what an engine told to stop at the chunk's
    end would generate)."""
    rejected_tokens: int = 0
    solutions: list[str] = field(default_factory=list)
    outcomes: list[bool] = field(default_factory=list)
    """Per problem, in order: whether its solution's answer was graded right (paired comparisons)."""

    @property
    def accuracy(self) -> float:
        return 100.0 * self.correct / self.problems if self.problems else 0.0

    @property
    def tokens(self) -> int:
        return self.accepted_tokens + self.rejected_tokens

    def as_dict(self) -> dict[str, float | int]:
        return {
            "problems": self.problems,
            "accuracy": round(self.accuracy, 3),
            "accepted_chunks": self.accepted_chunks,
            "rejected_chunks": self.rejected_chunks,
            "forced_chunks": self.forced_chunks,
            "accepted_tokens": self.accepted_tokens,
            "rejected_tokens": self.rejected_tokens,
            "tokens": self.tokens,
        }


def chunk_reset(
    backend: GenerationBackend,
    params: SamplingParams,
    judge: StepJudge,
    problems: Sequence[PolicyProblem],
    *,
    max_retries: int = 5,
    max_chunks: int = 64,
    delimiter: str = "\n\n",
    seed: int = 0,
    grader: Grader | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> ChunkResetReport:
    """Run chunk-reset for every problem, all problems' current chunks in one engine call."""
    if max_retries < 0:
        raise ValueError("max_retries must be 0 or more")
    grader = grader or Grader()
    report = ChunkResetReport(problems=len(problems))
    texts = [""] * len(problems)
    chunks: list[list[str]] = [[] for _ in problems]
    attempt = [0] * len(problems)
    active = list(range(len(problems)))
    while active:
        requests = [
            GenerationRequest(
                problems[p].prompt + texts[p], (derive_seed("chunk-reset", seed, p, len(chunks[p]), attempt[p]),)
            )
            for p in active
        ]
        outputs = backend.generate(requests, params)
        candidates = []
        for p, out in zip(active, outputs, strict=True):
            completion = out[0]
            segmentation = problems[p].segmentation
            chunk, last = (
                next_chunk(completion.text, segmentation) if segmentation else first_chunk(completion.text, delimiter)
            )
            if not chunk:  # the policy stopped: its solution ends here, with nothing to judge
                if on_progress:
                    on_progress(1)
                continue
            share = len(chunk) / len(completion.text)
            candidates.append((p, chunk, last, round(completion.tokens * share)))
        items = [
            StepItem(problems[p].question, tuple(chunks[p]), chunk, {"problem": p}) for p, chunk, _, _ in candidates
        ]
        verdicts = judge.judge(items) if items else []
        still = []
        for (p, chunk, last, tokens), verdict in zip(candidates, verdicts, strict=True):
            accept = verdict is True or attempt[p] >= max_retries
            if not accept:
                report.rejected_chunks += 1
                report.rejected_tokens += tokens
                attempt[p] += 1
                still.append(p)
                continue
            report.accepted_chunks += 1
            report.forced_chunks += verdict is not True
            report.accepted_tokens += tokens
            chunks[p].append(chunk)
            texts[p] += chunk
            attempt[p] = 0
            if last or len(chunks[p]) >= max_chunks:
                if on_progress:
                    on_progress(1)
            else:
                still.append(p)
        active = still
    report.outcomes = [grader.grade(texts[p], problem.reference).reward == 1 for p, problem in enumerate(problems)]
    report.correct = sum(report.outcomes)
    report.solutions = texts
    return report
