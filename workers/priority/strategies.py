"""Which waiting trajectory gets its rollouts next: a set's priority strategy, as pure functions.

Each strategy turns what the database holds about a waiting trajectory (the current judge's
score of each of its chunks, its own graded outcome, its id) into a priority in [0, 1];
higher goes first (``RolloutWork.dispatch_key``).  PRM800K's second phase chose what to label
by the current model: "convincing wrong-answer solutions", rated highly by the reward model
but ending in a wrong answer.  ``convincing-wrong`` is that (a right answer gets no priority,
whatever its rating); ``mirror=yes`` adds its mirror, stepq's own (right answers the judge rates low
rank as high as wrong ones it rates high: the default before 2026-12-02, which migration 0021
keeps on the sets and rounds that had it); ``uncertainty`` is classic uncertainty sampling (the
chunk nearest the judge's decision boundary); ``random`` is the control, and ``fifo`` today's
order.

A strategy is written ``NAME[:key=value,...]``: ``uncertainty:run=3`` (training run 3's
judge), ``convincing-wrong:lineage=judge`` (the lineage's latest trained judge, renewed by the
trainer service after every training), ``random:seed=7``.  ``votes=K`` asks a generative judge
K times per chunk (its P(Positive) is the share of Positive verdicts); ``score=logprob`` asks
it once, greedily, and reads P(Positive) at its verdict (one generation a chunk instead of K;
the backend must give log-probabilities, as the hf one does); ``threshold=T`` is the decision
boundary (default 0.5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stepq.models.errors import ConfigError
from stepq.workers.seeds import derive_seed

FIFO = "fifo"
RANDOM = "random"
UNCERTAINTY = "uncertainty"
CONVINCING_WRONG = "convincing-wrong"
STRATEGIES = (FIFO, RANDOM, UNCERTAINTY, CONVINCING_WRONG)
NEEDS_JUDGE = (UNCERTAINTY, CONVINCING_WRONG)
SCORES = ("votes", "logprob")
"""How a generative judge's P(Positive) is read: the share of K sampled verdicts, or the
probability at its one greedy verdict."""


@dataclass(frozen=True)
class Strategy:
    name: str = FIFO
    run: int | None = None
    """The judge: this training run's model ..."""
    lineage: str | None = None
    """... or the latest trained model of this lineage."""
    votes: int = 4
    threshold: float = 0.5
    seed: int = 0
    score: str = "votes"
    mirror: bool = False
    """``convincing-wrong`` only: right answers the judge rates low count too."""

    @property
    def key(self) -> str:
        """The canonical spelling, stored on the set."""
        parts = []
        if self.run is not None:
            parts.append(f"run={self.run}")
        if self.lineage is not None:
            parts.append(f"lineage={self.lineage}")
        if self.name in NEEDS_JUDGE:
            if self.votes != Strategy.votes:
                parts.append(f"votes={self.votes}")
            if self.threshold != Strategy.threshold:
                parts.append(f"threshold={self.threshold:g}")
            if self.score != Strategy.score:
                parts.append(f"score={self.score}")
        if self.mirror:
            parts.append("mirror=yes")
        if self.name == RANDOM and self.seed:
            parts.append(f"seed={self.seed}")
        return self.name + (":" + ",".join(parts) if parts else "")

    @property
    def needs_judge(self) -> bool:
        return self.name in NEEDS_JUDGE


def parse_strategy(text: str) -> Strategy:
    """``NAME[:key=value,...]``; a clear configuration error for anything else."""
    name, _, rest = text.strip().partition(":")
    if name not in STRATEGIES:
        raise ConfigError(f"unknown priority strategy '{name}' (one of: {', '.join(STRATEGIES)})")
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not value:
            raise ConfigError(f"priority option '{part}' is not KEY=VALUE")
        fields[key] = value
    judged = {"run", "lineage", "votes", "threshold", "score"}
    allowed = {RANDOM: {"seed"}, FIFO: set(), CONVINCING_WRONG: judged | {"mirror"}}.get(name, judged)
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ConfigError(f"priority strategy '{name}' takes no option {', '.join(unknown)}")
    try:
        strategy = Strategy(
            name,
            run=int(fields["run"]) if "run" in fields else None,
            lineage=fields.get("lineage"),
            votes=int(fields.get("votes", Strategy.votes)),
            threshold=float(fields.get("threshold", Strategy.threshold)),
            seed=int(fields.get("seed", 0)),
            score=fields.get("score", Strategy.score),
            mirror=_yes_no(fields.get("mirror", "no")),
        )
    except ValueError as exc:
        raise ConfigError(f"priority strategy '{text}': {exc}") from None
    if strategy.needs_judge and (strategy.run is None) == (strategy.lineage is None):
        raise ConfigError(f"priority strategy '{name}' needs a judge: run=N or lineage=NAME (one of them)")
    if strategy.votes < 1 or not 0.0 < strategy.threshold < 1.0:
        raise ConfigError("priority votes must be >= 1 and threshold strictly between 0 and 1")
    if strategy.score not in SCORES:
        raise ConfigError(f"priority score '{strategy.score}' is not one of: {', '.join(SCORES)}")
    return strategy


def _yes_no(value: str) -> bool:
    if value not in ("yes", "no"):
        raise ValueError(f"mirror is yes or no, not '{value}'")
    return value == "yes"


def uncertainty(scores: Sequence[float | None], threshold: float = 0.5) -> float:
    """1 for a trajectory with a chunk scored exactly at the threshold, falling linearly to 0
    for one whose every chunk is scored 0 or 1 (the nearest chunk decides).  Chunks the judge
    could not score count as undecided (1): asking about them is what is missing."""
    if not scores:
        return 0.0
    span = max(threshold, 1.0 - threshold)
    return max(1.0 if p is None else 1.0 - abs(p - threshold) / span for p in scores)


def solution_score(scores: Sequence[float | None]) -> float | None:
    """The judge's rating of a whole solution: its weakest chunk (None: nothing scored)."""
    known = [p for p in scores if p is not None]
    return min(known) if known else None


def convincing_wrong(scores: Sequence[float | None], outcome: bool | None, mirror: bool = False) -> float:
    """A wrong answer rated s scores s (the more convincing, the sooner); a right answer 0,
    or with ``mirror`` 1 - s (how far the rating contradicts the answer either way).
    Ungraded or unscored: 0."""
    rating = solution_score(scores)
    if rating is None or outcome is None:
        return 0.0
    if outcome:
        return 1.0 - rating if mirror else 0.0
    return rating


def random_priority(seed: int, trajectory_id: int) -> float:
    """A uniform draw in [0, 1) fixed by (seed, trajectory): reproducible, independent of the
    order the jobs are scored in."""
    return derive_seed("priority", seed, trajectory_id) / 2**31


def priority(strategy: Strategy, trajectory_id: int, scores: Sequence[float | None], outcome: bool | None) -> float:
    """The strategy's priority for one waiting trajectory."""
    if strategy.name == UNCERTAINTY:
        return uncertainty(scores, strategy.threshold)
    if strategy.name == CONVINCING_WRONG:
        return convincing_wrong(scores, outcome, strategy.mirror)
    if strategy.name == RANDOM:
        return random_priority(strategy.seed, trajectory_id)
    return 0.0


def dispatch_key(planned_at: float, priority_value: float, aging_s: float) -> float:
    """Lowest first: a priority of 1 moves a job ``aging_s`` ahead of one planned at the same
    moment, never further, so work planned ``aging_s`` earlier always goes first."""
    return planned_at - priority_value * aging_s
