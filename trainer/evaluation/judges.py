"""Step judges behind one interface: a model on any generation backend, a table of step
scores with a threshold (discriminative PRMs), and oracles for tests and benchmarks.

A judge answers, for each (problem, history, new chunk), True (accept), False (reject) or
None (no verdict).  How a missing verdict is scored is one choice, the same everywhere:
**no verdict is a rejection** (a judge that cannot say a step is right has not accepted it):
ProcessBench predicts that step as the first error, a snapshot's validation counts it wrong
whatever the label, Best-of-N scores it 0.  Every evaluation reports how many outputs had
no verdict and how many were cut by the length limit (``JudgeStats``), so a judge that
merely ran out of room is seen as such.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from stepq.models.errors import ConfigError
from stepq.trainer.generative_judge.prompt import NEGATIVE, POSITIVE, JudgePrompt, parse_verdict
from stepq.workers.backends.base import Completion, GenerationBackend, GenerationRequest, SamplingParams
from stepq.workers.backends.synthetic_policy import step_is_right
from stepq.workers.seeds import derive_seed


@dataclass(frozen=True)
class StepItem:
    """One chunk to judge; ``meta`` carries what a judge may need besides the text (ids)."""

    problem: str
    history: tuple[str, ...]
    chunk: str
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)


class StepJudge(Protocol):
    """Any judge: a verdict per step (True right, False wrong, None no verdict)."""

    name: str

    def judge(self, items: Sequence[StepItem]) -> list[bool | None]: ...


@runtime_checkable
class ScoringJudge(StepJudge, Protocol):
    """A judge that also scores every step of whole solutions (a PRM's probabilities, a
    generative judge's P(Positive)): what thresholds, ProcessBench scoring and Best-of-N
    aggregation read."""

    def score_solutions(self, solutions: Sequence[tuple[str, Sequence[str]]]) -> list[list[float | None]]: ...


@dataclass
class JudgeStats:
    """What a generative judge wrote: outputs, those with no parseable verdict, those cut by
    the length limit, and the chunks left without a majority verdict."""

    outputs: int = 0
    no_verdict: int = 0
    truncated: int = 0
    undecided: int = 0

    def copy(self) -> JudgeStats:
        return JudgeStats(self.outputs, self.no_verdict, self.truncated, self.undecided)

    def since(self, before: JudgeStats) -> JudgeStats:
        return JudgeStats(
            self.outputs - before.outputs,
            self.no_verdict - before.no_verdict,
            self.truncated - before.truncated,
            self.undecided - before.undecided,
        )

    def as_dict(self) -> dict[str, int]:
        return {
            "judge_outputs": self.outputs,
            "no_verdict": self.no_verdict,
            "truncated": self.truncated,
            "undecided_chunks": self.undecided,
        }


def judge_stats(judge: Any) -> JudgeStats:
    """A copy of the judge's counters so far (zeros for judges that write no text)."""
    stats = getattr(judge, "stats", None)
    return stats.copy() if isinstance(stats, JudgeStats) else JudgeStats()


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
    """Step scores computed elsewhere (another tool's PRM), by sample id: a scoring judge like
    any PRM (thresholds, a tuned or oracle threshold apply); accepts a step iff its score >=
    ``threshold``."""

    table: Mapping[str, Sequence[float]]
    threshold: float = 0.5
    name: str = "scores"

    def judge(self, items: Sequence[StepItem]) -> list[bool | None]:
        return [self.table[str(item.meta["id"])][int(item.meta["step"])] >= self.threshold for item in items]

    def score_samples(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, list[float | None]]:
        """Each sample's step scores (a step past the end of its row has none: below any threshold)."""
        missing = [str(s["id"]) for s in samples if str(s["id"]) not in self.table]
        if missing:
            raise ConfigError(
                f"the scores file has no row for {len(missing)} sample(s) (first: {', '.join(missing[:3])})"
            )
        out: dict[str, list[float | None]] = {}
        for s in samples:
            row = list(self.table[str(s["id"])])
            out[str(s["id"])] = [row[i] if i < len(row) else None for i in range(len(s["steps"]))]
        return out


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
    stats: JudgeStats = field(default_factory=JudgeStats)

    def _prompt(self, item: StepItem) -> str:
        text = self.prompt.render(item.problem, item.history, item.chunk)
        format_prompt = getattr(self.backend, "format_prompt", None) if self.chat_template else None
        return format_prompt(text) if format_prompt is not None else text

    def answers(self, items: Sequence[StepItem]) -> list[tuple[str, list[Completion]]]:
        """Each item's prompt and its ``votes`` sampled answers, counted in ``stats``."""
        requests = []
        for item in items:
            key = (item.problem, item.history, item.chunk)
            seeds = tuple(derive_seed("judge", self.seed, *key, v) for v in range(self.votes))
            requests.append(GenerationRequest(self._prompt(item), seeds))
        out = []
        for request, completions in zip(requests, self.backend.generate(requests, self.params), strict=True):
            self.stats.outputs += len(completions)
            self.stats.no_verdict += sum(parse_verdict(c.text) is None for c in completions)
            self.stats.truncated += sum(c.finish_reason == "length" for c in completions)
            out.append((request.context, completions))
        return out

    def judge(self, items: Sequence[StepItem]) -> list[bool | None]:
        out: list[bool | None] = []
        for _, completions in self.answers(items):
            verdicts = Counter(v for v in (parse_verdict(c.text) for c in completions) if v is not None)
            if not verdicts or verdicts[True] == verdicts[False]:
                self.stats.undecided += 1
                out.append(None)
            else:
                out.append(verdicts[True] > verdicts[False])
        return out


SCORE_BY = ("votes", "logprob")
VERDICT_OPENING = "\\boxed{"
FORCED_VERDICT = "\n2. Final Judgment: \\boxed{"


@dataclass
class GenerativeScorer:
    """A generative judge used as a scoring judge: each step's score is its probability of
    Positive, so thresholds (and ``--tune-threshold-on``) apply to it as to a PRM.

    ``votes``: the share of Positive among the judge's K answers (no verdict counts as not
    Positive).  ``logprob``: the judge writes its analysis (greedy, or its first vote), and
    the score is P(Positive) / (P(Positive) + P(Negative)) read from the model at the
    verdict's opening ``\\boxed{``; an answer with no box gets "2. Final Judgment: \\boxed{"
    appended first.  Needs a backend with ``continuation_logprobs`` (hf).
    """

    model: ModelJudge
    score_by: str = "votes"
    threshold: float = 0.5
    """``judge`` accepts a step whose score reaches it (ProcessBench may tune its own)."""
    name: str = "model-scores"

    def __post_init__(self) -> None:
        if self.score_by not in SCORE_BY:
            raise ValueError(f"score_by must be one of {SCORE_BY}")
        if self.score_by == "logprob" and not hasattr(self.model.backend, "continuation_logprobs"):
            from stepq.models.errors import ConfigError

            raise ConfigError(
                f"--score-by logprob needs the hf backend (this judge runs on {self.model.backend.name}); "
                "use --score-by votes with --votes K"
            )

    @property
    def stats(self) -> JudgeStats:
        return self.model.stats

    def scores(self, items: Sequence[StepItem]) -> list[float]:
        answers = self.model.answers(items)
        if self.score_by == "votes":
            return [sum(parse_verdict(c.text) is True for c in cs) / max(1, len(cs)) for _, cs in answers]
        pairs = []
        for prompt, completions in answers:
            text = completions[0].text if completions else ""
            cut = text.rfind(VERDICT_OPENING)
            prefix = prompt + (text[: cut + len(VERDICT_OPENING)] if cut >= 0 else text + FORCED_VERDICT)
            pairs += [(prefix, POSITIVE), (prefix, NEGATIVE)]
        logprobs = self.model.backend.continuation_logprobs(pairs)  # type: ignore[attr-defined]
        return [1.0 / (1.0 + math.exp(neg - pos)) for pos, neg in zip(logprobs[0::2], logprobs[1::2], strict=True)]

    def score_solutions(self, solutions: Sequence[tuple[str, Sequence[str]]]) -> list[list[float | None]]:
        """Every step of every solution scored (not stopping at a first rejection)."""
        items = [StepItem(p, tuple(steps[:i]), steps[i]) for p, steps in solutions for i in range(len(steps))]
        flat = iter(self.scores(items))
        return [[next(flat) for _ in steps] for _, steps in solutions]

    def judge(self, items: Sequence[StepItem]) -> list[bool | None]:
        return [s >= self.threshold for s in self.scores(items)]
