"""The pairwise step judge: which of two candidate next steps is better.

A judge model explains and answers ``[[A]]`` or ``[[B]]``.  How a candidate's score counts
the answers (``SCORINGS``; pure functions, the judges behind one small interface):

- ``each-verdict`` (default, the process-based self-rewarding method's): every pair is asked
  once, in a seeded random order, and candidate i scores sum_{j != i} O(s_i, s_j), the number
  of candidates it was judged better than.
- ``both-orders`` (stepq's stricter option): every pair is asked in both orders, (A=i, B=j)
  and (A=j, B=i), and counts only when both answers name the same candidate, so a judge's
  position bias cannot decide.  The method uses that check to filter its *judge training*
  data, not in the search; it costs twice the questions.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from stepq.models.errors import ConfigError
from stepq.workers.backends.base import GenerationBackend, GenerationRequest, SamplingParams
from stepq.workers.seeds import derive_seed

TEMPLATES = {
    "published": Path(__file__).resolve().parent / "templates" / "pairwise.txt",
    "brief": Path(__file__).resolve().parent / "templates" / "pairwise-brief.txt",
}
"""The judge's prompts by name.  ``published`` (the default) carries every element of the
method's judge prompt: an impartial judge, a detailed explanation before the verdict, no
position, length or name bias, ``[[A]]``/``[[B]]`` (the wording is stepq's).  ``brief`` is
stepq's option: a short explanation, for a judge whose token limit cuts long answers before
their verdict.  Any other value is a template file."""
TEMPLATE = TEMPLATES["published"]
EACH_VERDICT = "each-verdict"
BOTH_ORDERS = "both-orders"
SCORINGS = (EACH_VERDICT, BOTH_ORDERS)
VERDICT_BY = ("text", "logprob")
"""How a model judge answers: ``text``, its written ``[[A]]``/``[[B]]``; ``logprob``, the
more probable of the two verdicts right after the prompt (always an answer, no generation:
for a small model that has not learnt to write the format)."""
NO_HISTORY = "(none: this is the first step)"
_VERDICT = re.compile(r"\[\[\s*([AB])\s*\]\]")
_PLACEHOLDER = re.compile(r"\{(problem|history|a|b)\}")


def load_template(path: str | Path | None = None) -> str:
    """A named template (``TEMPLATES``) or a file with the four placeholders."""
    if isinstance(path, str) and path in TEMPLATES:
        path = TEMPLATES[path]
    try:
        text = Path(path or TEMPLATE).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"pairwise template {path!r}: neither a name ({', '.join(TEMPLATES)}) nor a readable file ({exc})"
        ) from None
    for placeholder in ("{problem}", "{history}", "{a}", "{b}"):
        if placeholder not in text:
            raise ConfigError(f"pairwise template {path} has no {placeholder} placeholder")
    return text


def render(template: str, problem: str, history: Sequence[str], a: str, b: str) -> str:
    """Fill the placeholders in one pass over the template: text put in is never read again,
    so ``\\frac{a}{b}`` in a problem, a previous step or a candidate stays as written."""
    values = {"problem": problem, "history": "".join(history).strip() or NO_HISTORY, "a": a, "b": b}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def parse_preference(text: str) -> str | None:
    """The last ``[[A]]`` or ``[[B]]`` of an answer; None when there is none."""
    found = _VERDICT.findall(text)
    return found[-1] if found else None


@dataclass(frozen=True)
class Comparison:
    """Candidate ``first`` shown as A and ``second`` as B."""

    first: int
    second: int


def comparisons(width: int) -> list[Comparison]:
    """Every unordered pair of candidates in both orders: w (w - 1) questions."""
    out = []
    for i, j in itertools.combinations(range(width), 2):
        out += [Comparison(i, j), Comparison(j, i)]
    return out


def questions_for(scoring: str, width: int, flip: Callable[[int, int], bool]) -> list[Comparison]:
    """What to ask: both orders of every pair, or each pair once with ``flip(i, j)`` (a seeded
    coin) deciding which candidate is shown first: w (w - 1) / 2 questions."""
    if scoring == BOTH_ORDERS:
        return comparisons(width)
    if scoring != EACH_VERDICT:
        raise ConfigError(f"unknown search scoring '{scoring}' (one of: {', '.join(SCORINGS)})")
    return [Comparison(j, i) if flip(i, j) else Comparison(i, j) for i, j in itertools.combinations(range(width), 2)]


def score_candidates(
    scoring: str, width: int, asked: Sequence[Comparison], answers: Sequence[str | None]
) -> tuple[list[int], int]:
    """(each candidate's score, how many pairs counted) under ``scoring``; an answer without a
    verdict counts for neither candidate."""
    if scoring == BOTH_ORDERS:
        pair_winners = winners(asked, answers)
        return win_scores(width, pair_winners), sum(w is not None for w in pair_winners.values())
    scores = [0] * width
    for c, answer in zip(asked, answers, strict=True):
        if answer is not None:
            scores[c.first if answer == "A" else c.second] += 1
    return scores, sum(a is not None for a in answers)


def winners(asked: Sequence[Comparison], answers: Sequence[str | None]) -> dict[tuple[int, int], int | None]:
    """Per unordered pair (i < j): the candidate both orders preferred, or None when the two
    answers disagree or one is missing (an inconsistent pair does not count)."""
    named: dict[tuple[int, int], list[int | None]] = {}
    for c, answer in zip(asked, answers, strict=True):
        pick = None if answer is None else (c.first if answer == "A" else c.second)
        named.setdefault((min(c.first, c.second), max(c.first, c.second)), []).append(pick)
    return {pair: picks[0] if len(picks) == 2 and picks[0] == picks[1] else None for pair, picks in named.items()}


def win_scores(width: int, pair_winners: dict[tuple[int, int], int | None]) -> list[int]:
    scores = [0] * width
    for winner in pair_winners.values():
        if winner is not None:
            scores[winner] += 1
    return scores


@dataclass(frozen=True)
class Decision:
    """``advance`` with (best, worst) when scores differ, else ``rollback``."""

    action: str
    best: int | None = None
    worst: int | None = None


def decide(scores: Sequence[int]) -> Decision:
    """Keep the best candidate and pair it with the worst; when every score ties the judge
    has said nothing useful about this prefix, so step back.  Ties go to the lower index
    (candidates are seeded draws, so this is a fixed, fair rule)."""
    if len(set(scores)) <= 1:
        return Decision("rollback")
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    worst = min(range(len(scores)), key=lambda i: (scores[i], i))
    return Decision("advance", best, worst)


@dataclass(frozen=True)
class PairQuestion:
    problem: str
    history: tuple[str, ...]
    a: str
    b: str


class PairwiseJudge(Protocol):
    name: str

    def prefer(self, questions: Sequence[PairQuestion]) -> list[str | None]: ...


@dataclass
class ModelPairwiseJudge:
    """A judge model on any generation backend, one seeded answer per question."""

    backend: GenerationBackend
    params: SamplingParams
    template: str = field(default_factory=load_template)
    seed: int = 0
    name: str = "model"
    verdict_by: str = "text"

    def prefer(self, questions: Sequence[PairQuestion]) -> list[str | None]:
        format_prompt = getattr(self.backend, "format_prompt", None)
        if self.verdict_by == "logprob":
            scorer = getattr(self.backend, "continuation_logprobs", None)
            if scorer is None:
                raise ConfigError(f"the {type(self.backend).__name__} backend cannot score verdicts (verdict_by=text)")
            prompts = [render(self.template, q.problem, q.history, q.a, q.b) for q in questions]
            contexts = [format_prompt(p) if format_prompt else p for p in prompts]
            lp = scorer([(c, v) for c in contexts for v in ("[[A]]", "[[B]]")])
            return ["A" if lp[2 * i] >= lp[2 * i + 1] else "B" for i in range(len(questions))]
        requests = []
        for q in questions:
            text = render(self.template, q.problem, q.history, q.a, q.b)
            requests.append(
                GenerationRequest(
                    format_prompt(text) if format_prompt else text,
                    (derive_seed("pairwise", self.seed, q.problem, *q.history, q.a, q.b),),
                )
            )
        return [parse_preference(c[0].text) if c else None for c in self.backend.generate(requests, self.params)]


@dataclass
class SyntheticPairwiseOracle:
    """Knows the synthetic policy's truth: prefers a right step to a wrong one.  Between two
    steps of the same truth it answers ``A``, the position bias a real judge can have (which
    the two-order check turns into no decision, and single asking into a coin flip)."""

    name: str = "synthetic-oracle"

    def prefer(self, questions: Sequence[PairQuestion]) -> list[str | None]:
        from stepq.workers.backends.synthetic_policy import step_is_right

        out: list[str | None] = []
        for q in questions:
            a, b = (step_is_right(q.problem, q.history, c) for c in (q.a, q.b))
            out.append("B" if (b and not a) else "A")
        return out
