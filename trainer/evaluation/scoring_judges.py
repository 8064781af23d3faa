"""The judge a worker scores a priority round with, built from the round's training run.

Workers sit below the trainer (docs/architecture.md, "Layers"): they never import it.  The
front end that assembles a worker process hands it ``ScoringJudges`` as its judge factory,
and the priority scoring handler asks that for a run's judge.  One judge is kept warm at a
time: a round's judge replaces the last (a PRM scores every chunk in one pass; a generative
judge is asked ``votes`` times per chunk on the hf backend, its P(Positive) the share of
Positive verdicts, or once with ``score=logprob``, its P(Positive) read at its verdict).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stepq.models import Database, TrainingRun
from stepq.models.errors import ConfigError
from stepq.trainer.training.runs import FINAL
from stepq.workers.priority.strategies import Strategy


def build_scoring_judge(method: str, output_dir: str, strategy: Strategy) -> Any:
    """A judge that scores every chunk of a solution (``ScoringJudge``) from a training run."""
    model = Path(output_dir) / FINAL
    if not model.exists():
        raise ConfigError(f"the judge's model {model} is not on this worker (train it, or share the runs folder)")
    if method == "prm":
        from stepq.trainer.evaluation.judges import PRMJudge
        from stepq.trainer.prm.model import StepScorer

        return PRMJudge(StepScorer.load(str(model)), strategy.threshold)
    from stepq.trainer.evaluation.judge_spec import JudgeSpec, build_judge

    votes = 1 if strategy.score == "logprob" else strategy.votes
    spec = JudgeSpec(kind="model", backend="hf", model=str(model), votes=votes, score_by=strategy.score)
    return build_judge(spec).judge


class ScoringJudges:
    """A worker's judge factory: ``(run id, strategy) -> judge``, the latest one kept warm."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._warm: dict[tuple[int, int, float, str], Any] = {}

    def __call__(self, run_id: int, strategy: Strategy) -> Any:
        key = (run_id, strategy.votes, strategy.threshold, strategy.score)
        if key not in self._warm:
            with self.db.session() as s:
                run = s.get_one(TrainingRun, run_id)
                method, output_dir = run.method, run.output_dir
            self._warm.clear()  # one judge warm at a time: a round's judge replaces the last
            self._warm[key] = build_scoring_judge(method, output_dir, strategy)
        return self._warm[key]
