"""Test-time step search (process-based self-rewarding): at every step the policy samples
``width`` candidates (T = 0.5, top_p = 0.95 by default), the pairwise judge ranks them and the
best is kept, with the search's own rollback on a tie; its accuracy against the policy alone.

The search is ``workers.search.step_search`` itself (the turns that make preference pairs),
run here without the queue: one problem at a time, nothing written.  The policy alone is the
method's baseline, **greedy decoding** (T = 0: "We use greedy search in evaluations", its
test-time comparison); ``baseline="sampled"`` draws one solution per problem with the
search's own sampling instead (weaker than greedy as a rule, so the search's gain over it
reads larger than the paper's).  A search that reaches ``max_turns`` unfinished is completed
by one plain draw from its kept steps, so both sides always answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from stepq.models.search import FINISH
from stepq.trainer.evaluation.chunk_reset import PolicyProblem
from stepq.workers.backends.base import Completion, GenerationBackend, GenerationRequest, SamplingParams
from stepq.workers.grading.grader import Grader
from stepq.workers.search.pairwise import EACH_VERDICT, PairwiseJudge
from stepq.workers.search.step_search import SearchSpec, next_turn, replay
from stepq.workers.seeds import derive_seed


class _CountingBackend:
    """The policy, counting the tokens it writes (every candidate, kept or not)."""

    def __init__(self, backend: GenerationBackend) -> None:
        self.backend = backend
        self.name = backend.name
        self.generator = backend.generator
        self.tokens = 0

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
        out = self.backend.generate(requests, params)
        self.tokens += sum(c.tokens for comps in out for c in comps)
        return out

    def close(self) -> None:
        return None


GREEDY, SAMPLED = "greedy", "sampled"
BASELINES = (GREEDY, SAMPLED)


def baseline_params(params: SamplingParams, baseline: str) -> SamplingParams:
    """The policy-alone side's sampling: greedy (T = 0, the whole distribution) or the search's."""
    if baseline == GREEDY:
        return replace(params, temperature=0.0, top_p=1.0)
    if baseline == SAMPLED:
        return params
    raise ValueError(f"unknown baseline {baseline!r} (one of: {', '.join(BASELINES)})")


@dataclass
class SideReport:
    problems: int = 0
    correct: int = 0
    tokens: int = 0

    @property
    def accuracy(self) -> float:
        return 100.0 * self.correct / self.problems if self.problems else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {"problems": self.problems, "accuracy": round(self.accuracy, 3), "tokens": self.tokens}


def search_at_test_time(
    policy: GenerationBackend,
    params: SamplingParams,
    judge: PairwiseJudge,
    problems: Sequence[PolicyProblem],
    *,
    width: int = 6,
    max_turns: int = 20,
    seed: int = 0,
    scoring: str = EACH_VERDICT,
    grader: Grader | None = None,
    on_progress: Callable[[int], None] | None = None,
    baseline: str = GREEDY,
) -> dict[str, object]:
    """The policy alone (greedy by default, as published) and the judge-guided step search on
    the same problems, graded, with the tokens each wrote."""
    grader = grader or Grader()
    counted = _CountingBackend(policy)
    alone, searched = SideReport(len(problems)), SideReport(len(problems))
    requests = [GenerationRequest(p.prompt, (derive_seed("policy-alone", seed, i),)) for i, p in enumerate(problems)]
    alone_params = baseline_params(params, baseline)
    for problem, out in zip(problems, counted.generate(requests, alone_params), strict=True):
        alone.correct += grader.grade(out[0].text, problem.reference).reward
    alone.tokens, counted.tokens = counted.tokens, 0
    turns = rollbacks = exhausted = unanswered = 0
    for i, problem in enumerate(problems):
        spec = SearchSpec(
            f"eval-{i}",
            problem.question,
            problem.prompt,
            width,
            max_turns,
            seed,
            segmentation=problem.segmentation,
            scoring=scoring,
        )
        done: list[tuple[str, list[str], int | None]] = []
        kept: list[str] = []
        finished = False
        while not finished and len(done) < max_turns:
            turn = next_turn(spec, len(done), kept, counted, params, judge)
            done.append((turn.action, turn.candidates, turn.chosen))
            rollbacks += turn.chosen is None
            unanswered += turn.unanswered
            kept, finished = replay(done)
            finished = finished or turn.action == FINISH
        turns += len(done)
        text = "".join(kept)
        if not finished:  # out of turns: the policy completes the rest in one draw
            exhausted += 1
            rest = counted.generate([GenerationRequest(problem.prompt + text, (spec.seed,))], params)
            text += rest[0][0].text
        searched.correct += grader.grade(text, problem.reference).reward
        if on_progress:
            on_progress(1)
    searched.tokens = counted.tokens
    return {
        "baseline": baseline,
        "policy_alone": {
            **alone.as_dict(),
            "sampling": {"temperature": alone_params.temperature, "top_p": alone_params.top_p},
        },
        "step_search": {
            **searched.as_dict(),
            "turns": turns,
            "turns_without_a_pick": rollbacks,
            "completed_after_max_turns": exhausted,
            "answers_without_a_verdict": unanswered,
        },
        "width": width,
        "max_turns": max_turns,
        "sampling": {"temperature": params.temperature, "top_p": params.top_p},
    }
