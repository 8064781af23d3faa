"""Step judges behind one interface: a model on any generation backend, a table of step
scores with a threshold (discriminative PRMs), and oracles for tests and benchmarks.

A judge answers, for each (problem, history, new chunk), True (accept), False (reject) or
None (no verdict).  Callers treat None as a rejection: a judge that cannot say a step is
right has not accepted it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from stepq.trainer.judge.prompt import JudgePrompt, parse_verdict
from stepq.workers.backends.base import GenerationBackend, GenerationRequest, SamplingParams
from stepq.workers.seeds import derive_seed
from stepq.workers.synthetic_policy import step_is_right


@dataclass(frozen=True)
class StepItem:
    """One chunk to judge; ``meta`` carries what a judge may need besides the text (ids)."""

    problem: str
    history: tuple[str, ...]
    chunk: str
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)


class StepJudge(Protocol):
    name: str

    def judge(self, items: Sequence[StepItem]) -> list[bool | None]: ...


@dataclass
class AcceptAll:
    """Accepts every chunk: the control that must change nothing."""

    name: str = "accept-all"

    def judge(self, items: Sequence[StepItem]) -> list[bool | None]:
        return [True for _ in items]


@dataclass
class SyntheticOracle:
    """Knows the synthetic policy's truth: a chunk is right iff it and every chunk before it
    compute the true running value (the same definition as ``chunks.ground_truth``)."""

    name: str = "oracle"

    def judge(self, items: Sequence[StepItem]) -> list[bool | None]:
        return [step_is_right(item.problem, item.history, item.chunk) for item in items]


@dataclass
class LabelOracle:
    """ProcessBench's own labels as a judge (``meta['label']`` = first wrong step, -1 if
    none; ``meta['step']`` = 0-based step index): scores 100 by construction."""

    name: str = "label-oracle"

    def judge(self, items: Sequence[StepItem]) -> list[bool | None]:
        return [item.meta["label"] == -1 or item.meta["step"] < item.meta["label"] for item in items]


@dataclass
class ScoreJudge:
    """A scoring judge (a discriminative PRM): accept iff the step's score >= ``threshold``.
    ``score`` maps (sample id, 0-based step) to the step's score."""

    score: Callable[[str, int], float]
    threshold: float = 0.5
    name: str = "scores"

    def judge(self, items: Sequence[StepItem]) -> list[bool | None]:
        return [self.score(str(item.meta["id"]), int(item.meta["step"])) >= self.threshold for item in items]


@dataclass
class PRMJudge:
    """A trained discriminative PRM (``stepq train --method prm``) as a judge: each step's
    probability of being right, accepted at ``threshold``.  ``score_solutions`` scores every
    step of whole solutions in one forward pass each (ProcessBench, Best-of-N)."""

    scorer: Any
    threshold: float = 0.5
    name: str = "prm"

    def score_solutions(self, solutions: Sequence[tuple[str, Sequence[str]]]) -> list[list[float | None]]:
        return list(self.scorer.score(solutions))

    def scores(self, items: Sequence[StepItem]) -> list[float | None]:
        rows = self.score_solutions([(i.problem, (*i.history, i.chunk)) for i in items])
        return [row[-1] for row in rows]

    def judge(self, items: Sequence[StepItem]) -> list[bool | None]:
        return [None if s is None else s >= self.threshold for s in self.scores(items)]


@dataclass
class ModelJudge:
    """A generative judge on any backend: renders the judge prompt, samples ``votes``
    answers per chunk (seeded, so a re-run gives the same verdicts) and takes the majority
    of the parsed verdicts; a tie or no parsed verdict is no verdict.

    With ``chat_template`` the prompt goes through the backend's own ``format_prompt`` (the
    model's chat template, applied once, as in training with ``conversational: true``).
    """

    backend: GenerationBackend
    params: SamplingParams
    prompt: JudgePrompt = field(default_factory=JudgePrompt.load)
    votes: int = 1
    seed: int = 0
    chat_template: bool = True
    name: str = "model"

    def judge(self, items: Sequence[StepItem]) -> list[bool | None]:
        format_prompt = getattr(self.backend, "format_prompt", None) if self.chat_template else None
        requests = []
        for item in items:
            text = self.prompt.render(item.problem, item.history, item.chunk)
            if format_prompt is not None:
                text = format_prompt(text)
            key = (item.problem, item.history, item.chunk)
            seeds = tuple(derive_seed("judge", self.seed, *key, v) for v in range(self.votes))
            requests.append(GenerationRequest(text, seeds))
        out: list[bool | None] = []
        for completions in self.backend.generate(requests, self.params):
            verdicts = Counter(v for v in (parse_verdict(c.text) for c in completions) if v is not None)
            if not verdicts or verdicts[True] == verdicts[False]:
                out.append(None)
            else:
                out.append(verdicts[True] > verdicts[False])
        return out
