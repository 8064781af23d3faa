"""Setting a set's priority strategy and starting the rounds that apply it.

A round resolves the strategy's judge to one finished training run (``run=N`` as named,
``lineage=NAME`` its latest finished run now), records what the set had spent and labelled,
and leaves the scoring itself to queue jobs (``workers/priority/scoring_handler.py``), so a million
waiting trajectories are scored by the fleet, resumably, not by the command that asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from stepq.models import ProblemSet, TrainingRun, queries
from stepq.models.errors import ConfigError, NotFoundError
from stepq.models.training import RUN_DONE
from stepq.workers.priority.strategies import FIFO, Strategy, parse_strategy

SCORING_BATCH = 256
"""Waiting trajectories per scoring job: one judge call's worth, a lease's worth of work."""
JUDGE_METHODS = ("prm", "grpo", "sft")
"""Training methods whose output scores steps: a discriminative PRM, a generative judge (by
GRPO, or its supervised start)."""
_OWN_JUDGE_METHODS: set[str] = set()


def accept_judge_method(name: str) -> None:
    """Let this process order work by the runs of another method: one whose judges this
    process's workers build with a judge factory of their own (``worker_runtime(...,
    judge_factory=...)``), such as a benchmark's stand-in."""
    _OWN_JUDGE_METHODS.add(name)


def judge_methods() -> tuple[str, ...]:
    return (*JUDGE_METHODS, *sorted(_OWN_JUDGE_METHODS))


@dataclass(frozen=True)
class RoundReport:
    strategy: str
    round_id: int | None
    judge_run_id: int | None
    scoring_jobs: int
    reset: int = 0


def judge_run(session: Session, strategy: Strategy) -> TrainingRun:
    """The finished training run whose judge the strategy asks now."""
    if strategy.run is not None:
        run = session.get(TrainingRun, strategy.run)
        if run is None:
            raise NotFoundError(f"no training run {strategy.run} (see 'stepq runs')")
    else:
        assert strategy.lineage is not None
        done = [r for r in queries.lineage_runs(session, strategy.lineage) if r.status == RUN_DONE]
        if not done:
            raise NotFoundError(
                f"lineage '{strategy.lineage}' has no finished training run yet: train one first "
                f"('stepq trainer serve --lineage {strategy.lineage} ...'), or order by run=N"
            )
        run = done[-1]
    if run.status != RUN_DONE:
        raise ConfigError(f"training run {run.id} is {run.status}, not done: its judge cannot order work yet")
    if run.method not in judge_methods():
        raise ConfigError(
            f"training run {run.id} trained a {run.method} model, not a judge (one of: {', '.join(judge_methods())})"
        )
    return run


def start_round(session: Session, pset: ProblemSet, batch: int = SCORING_BATCH) -> RoundReport:
    """Order the set's waiting work by its strategy now (a new round; ``fifo``: plan order)."""
    strategy = parse_strategy(pset.priority_strategy)
    if strategy.name == FIFO:
        return RoundReport(FIFO, None, None, 0, reset=queries.reset_priorities(session, pset.id))
    run = judge_run(session, strategy) if strategy.needs_judge else None
    labelled = queries.count_labelled(session, [pset.id], pset.label_rule)
    details = {"judge_method": run.method, "judge_model": run.output_dir} if run is not None else {}
    round_id, n_jobs = queries.start_round(
        session, pset.id, strategy.key, run.id if run else None, labelled, batch, details
    )
    return RoundReport(strategy.key, round_id, run.id if run else None, n_jobs)


def set_priority(session: Session, pset: ProblemSet, strategy_text: str, aging_s: float | None = None) -> RoundReport:
    """Make ``strategy_text`` the set's order and apply it (a first round)."""
    strategy = parse_strategy(strategy_text)
    if aging_s is not None:
        if aging_s <= 0:
            raise ConfigError("--priority-aging must be positive (seconds)")
        pset.priority_aging_s = aging_s
    if strategy.needs_judge:
        judge_run(session, strategy)  # refuse a judge that cannot order work before storing it
    pset.priority_strategy = strategy.key
    session.flush()
    return start_round(session, pset)


def follow_lineage(session: Session, lineage: str, batch: int = SCORING_BATCH) -> list[RoundReport]:
    """After the lineage trained a new judge: a new round for every set ordered by it."""
    out = []
    for pset in queries.prioritised_sets(session):
        if parse_strategy(pset.priority_strategy).lineage == lineage:
            out.append(start_round(session, pset, batch))
    return out
