"""Queue work: score a range of a set's waiting trajectories with a round's judge and write
their priorities (``workers/priority/strategies.py`` turns scores into priorities).

A scoring job is a job like any other (claimed under a lease the heartbeat renews, failed or
retried with backoff, handed back when the process stops); it reads the waiting work of its
id range when it runs, so work that started meanwhile is skipped, and its writes never land
on work a later round placed.  The judge is built once per process and kept warm: a PRM
(``stepq train --method prm``) scores every chunk in one pass; a generative judge
(``--method grpo``) is asked ``votes`` times per chunk on the hf backend, its P(Positive) the
share of Positive verdicts.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from stepq.models import PriorityRound, PriorityScoring, ProblemSet, queries
from stepq.models.errors import ConfigError
from stepq.models.prioritization import PRIORITY_SCORINGS
from stepq.workers.jobqueue.job_kind import JobKind
from stepq.workers.jobqueue.runner import Claimed
from stepq.workers.jobqueue.runtime import WorkerRuntime
from stepq.workers.priority.rounds import SCORING_BATCH
from stepq.workers.priority.strategies import Strategy, dispatch_key, parse_strategy, priority


def judge_of(rt: WorkerRuntime, run_id: int, strategy: Strategy) -> Any:
    """The round's judge, from the factory the process was assembled with."""
    if rt.engines.judge_factory is None:
        raise ConfigError(
            "this worker was started without a judge factory: it cannot score for a prioritised set's round"
        )
    return rt.engines.judge_factory(run_id, strategy)


def handle_scorings(rt: WorkerRuntime, claimed: Claimed) -> None:
    """Score each claimed job's waiting trajectories and write their priorities."""
    claimed.one_by_one(lambda job_id: _score(rt, claimed, job_id))


def _score(rt: WorkerRuntime, claimed: Claimed, job_id: int) -> bool:
    with rt.db.session() as s:
        job = s.get_one(PriorityScoring, job_id)
        round_ = s.get_one(PriorityRound, job.round_id)
        aging = s.get_one(ProblemSet, job.problem_set_id).priority_aging_s
        round_id, run_id, strategy_text = round_.id, round_.judge_run_id, round_.strategy
        waiting = queries.waiting_in_range(s, job.problem_set_id, job.work_from_id, job.work_to_id)
    strategy = parse_strategy(strategy_text)
    scores: list[list[float | None]] = [[] for _ in waiting]
    if strategy.needs_judge and waiting:
        if run_id is None:
            raise ConfigError(f"priority round {round_id} has no judge (its training run was deleted)")
        judge = judge_of(rt, run_id, strategy)
        with rt.deadline(f"priority scoring {job_id}"):
            scores = judge.score_solutions([(w.question, w.chunks) for w in waiting])
    rows = []
    for w, chunk_scores in zip(waiting, scores, strict=True):
        p = priority(strategy, w.trajectory_id, chunk_scores, w.outcome)
        rows.append((w.work_id, p, dispatch_key(w.planned_at, p, aging)))
    with rt.db.session() as s:
        written = queries.write_priorities(s, round_id, rows)
        claimed.finish(s, job_id, scored=written)
    return True


def plan_scorings(session: Session) -> int:
    """The dispatcher's hook, after the rollouts kind planned its work in the same transaction:
    scoring jobs for a prioritised set's work planned since its round began (new problems, new
    trajectories), so none of it is published unordered."""
    return queries.cover_new_work(session, SCORING_BATCH)


SCORINGS = JobKind(PRIORITY_SCORINGS, "stepq.priority_scoring", handle_scorings, plan=plan_scorings)
"""A range of a set's waiting trajectories scored by a priority round's judge; made when a
round starts, and for work planned later (its own planning hook)."""
