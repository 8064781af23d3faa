"""One step search, turn by turn, resumable from its stored turns.

A turn samples ``width`` candidate next steps from the current prefix (seeded by the search's
name, the problem and the turn number, so a turn redone after a crash, or the same search in
another database, draws the same candidates), asks the pairwise judge about the pairs (each
once, or in both orders: ``pairwise.SCORINGS``), and then:

- ``advance``: keep the candidate with the highest score; (best, worst) is a step
  preference pair with the policy prompt and the prefix as its prompt;
- ``finish``: the same, when the kept step ends the solution (a final answer);
- ``rollback``: every score tied, the judge could not tell them apart; drop the last kept
  step, and its pair, and search again from one step earlier;
- ``resample``: tied with nothing to drop; sample again from the same prefix.

The search's state is a function of its turns (``replay``), so the worker keeps nothing
between turns that the database does not hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from stepq.models.search import ADVANCE, FINISH, RESAMPLE, ROLLBACK
from stepq.workers.backends.base import GenerationBackend, GenerationRequest, SamplingParams
from stepq.workers.data.segmentation import next_chunk
from stepq.workers.search.pairwise import (
    EACH_VERDICT,
    PairQuestion,
    PairwiseJudge,
    decide,
    questions_for,
    score_candidates,
)
from stepq.workers.seeds import derive_seed


@dataclass(frozen=True)
class SearchSpec:
    name: str
    question: str
    prompt: str
    width: int
    max_turns: int
    seed: int
    segmentation: str | None = None
    """How a candidate is cut to one step: the set's own method (``segmentation.next_chunk``),
    so a turn is one step as the policy writes steps; None: at the first blank line."""
    scoring: str = EACH_VERDICT


@dataclass(frozen=True)
class Turn:
    turn: int
    prefix: list[str]
    candidates: list[str]
    wins: list[int]
    consistent_pairs: int
    action: str
    chosen: int | None
    rejected: int | None
    unanswered: int = 0
    """Answers without a verdict (cut at the judge's token limit): counted for neither side."""

    def row(self) -> dict[str, object]:
        return asdict(self)


def replay(actions: Sequence[tuple[str, list[str], int | None]]) -> tuple[list[str], bool]:
    """The kept steps after these turns (action, candidates, chosen), and whether the
    search has finished."""
    prefix: list[str] = []
    for action, candidates, chosen in actions:
        if action in (ADVANCE, FINISH):
            assert chosen is not None
            prefix.append(candidates[chosen])
            if action == FINISH:
                return prefix, True
        elif action == ROLLBACK and prefix:
            prefix.pop()
    return prefix, False


def surviving_pairs(actions: Sequence[str]) -> list[int]:
    """Indices of the turns whose (best, worst) pair is training data: every advancing turn
    whose kept step is still kept at the end.  A rollback drops the last kept step *and its
    pair*, as the process-based self-rewarding method discards (best_{l-1}, worst_{l-1})."""
    kept: list[int] = []
    for i, action in enumerate(actions):
        if action in (ADVANCE, FINISH):
            kept.append(i)
        elif action == ROLLBACK and kept:
            kept.pop()
    return kept


def candidate_params(set_sampling: dict[str, Any] | None, search_sampling: dict[str, Any] | None) -> SamplingParams:
    """The candidates' sampling: the search's (temperature, top_p: the method's T = 0.5,
    top_p = 0.95 by default) over the set's own, which keeps its max tokens and stops."""
    return SamplingParams.from_config({**(set_sampling or {}), **(search_sampling or {})})


def candidate_seeds(spec: SearchSpec, turn: int) -> tuple[int, ...]:
    """The seeds of a turn's ``width`` candidates: a turn redone draws the same ones."""
    return tuple(derive_seed("step-search", spec.seed, spec.name, spec.question, turn, k) for k in range(spec.width))


def next_turn(
    spec: SearchSpec,
    turn: int,
    prefix: Sequence[str],
    policy: GenerationBackend,
    params: SamplingParams,
    judge: PairwiseJudge,
) -> Turn:
    [samples] = policy.generate([GenerationRequest(spec.prompt + "".join(prefix), candidate_seeds(spec, turn))], params)
    cut = [next_chunk(c.text, spec.segmentation) for c in samples]
    candidates = [chunk for chunk, _ in cut]
    asked = questions_for(
        spec.scoring,
        spec.width,
        lambda i, j: bool(derive_seed("pair-order", spec.seed, spec.name, spec.question, turn, i, j) & 1),
    )
    answers = judge.prefer(
        [PairQuestion(spec.question, tuple(prefix), candidates[c.first], candidates[c.second]) for c in asked]
    )
    wins, consistent = score_candidates(spec.scoring, spec.width, asked, answers)
    unanswered = sum(a is None for a in answers)
    decision = decide(wins)
    if decision.action == "rollback":
        action = ROLLBACK if prefix else RESAMPLE
        return Turn(turn, list(prefix), candidates, wins, consistent, action, None, None, unanswered)
    assert decision.best is not None
    last = cut[decision.best][1] or not candidates[decision.best].strip()
    action = FINISH if last else ADVANCE
    return Turn(turn, list(prefix), candidates, wins, consistent, action, decision.best, decision.worst, unanswered)
