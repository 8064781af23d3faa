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

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepq.models import PriorityRound, PriorityScoring, ProblemSet, TrainingRun, jobs, queries
from stepq.models.errors import ConfigError
from stepq.models.prioritization import PRIORITY_SCORINGS
from stepq.workers.jobqueue import runner as queue
from stepq.workers.priority.strategies import Strategy, dispatch_key, parse_strategy, priority

if TYPE_CHECKING:
    from stepq.workers.labelling.rollouts import WorkerRuntime

log = logging.getLogger("stepq.worker")


def build_scoring_judge(method: str, output_dir: str, strategy: Strategy) -> Any:
    """A judge that scores every chunk of a solution (``ScoringJudge``) from a training run."""
    from stepq.trainer.training.runs import FINAL

    model = Path(output_dir) / FINAL
    if not model.exists():
        raise ConfigError(f"the judge's model {model} is not on this worker (train it, or share the runs folder)")
    if method == "prm":
        from stepq.trainer.evaluation.judges import PRMJudge
        from stepq.trainer.prm.model import StepScorer

        return PRMJudge(StepScorer.load(str(model)), strategy.threshold)
    from stepq.trainer.evaluation.judge_spec import JudgeSpec, build_judge

    spec = JudgeSpec(kind="model", backend="hf", model=str(model), votes=strategy.votes, score_by="votes")
    return build_judge(spec).judge


def judge_of(rt: WorkerRuntime, run_id: int, strategy: Strategy) -> Any:
    """The round's judge, built once per process (``rt.judge_override`` replaces it)."""
    if rt.judge_override is not None:
        return rt.judge_override(run_id)
    key = (run_id, strategy.votes, strategy.threshold)
    if key not in rt.judges:
        with rt.db.session() as s:
            run = s.get_one(TrainingRun, run_id)
            method, output_dir = run.method, run.output_dir
        rt.judges.clear()  # one judge warm at a time: a round's judge replaces the last
        rt.judges[key] = build_scoring_judge(method, output_dir, strategy)
    return rt.judges[key]


def run_scorings(rt: WorkerRuntime, ids: Sequence[int]) -> dict[int, str]:
    """Each scoring job's status: done, skipped (someone else has it), lost, handed-back, failed."""
    out: dict[int, str] = {}
    for job_id in ids:
        if rt.stopping.is_set():
            out[job_id] = "handed-back"  # still queued: the dispatcher republishes it once lost
            continue
        with rt.held.holding(PRIORITY_SCORINGS, [job_id]):
            out[job_id] = _run_scoring(rt, job_id)
    return out


def _run_scoring(rt: WorkerRuntime, job_id: int) -> str:
    with rt.db.session() as s:
        if not jobs.claim(s, PRIORITY_SCORINGS, job_id, rt.name, rt.options.lease_ttl_s):
            return "skipped"
        job = s.get_one(PriorityScoring, job_id)
        round_ = s.get_one(PriorityRound, job.round_id)
        aging = s.get_one(ProblemSet, job.problem_set_id).priority_aging_s
        round_id, run_id, strategy_text = round_.id, round_.judge_run_id, round_.strategy
        waiting = queries.waiting_in_range(s, job.problem_set_id, job.work_from_id, job.work_to_id)
    try:
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
            if not jobs.finish(s, PRIORITY_SCORINGS, job_id, rt.name, scored=written):
                s.rollback()
                return "lost"
        return "done"
    except Exception as exc:  # an attempt counted, retried with backoff unless permanent
        return queue.fail(rt.db, PRIORITY_SCORINGS, job_id, rt.name, exc, rt.retry)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt: released, then on its way
        queue.release_unfinished(rt.db, PRIORITY_SCORINGS, [job_id], rt.name, exc, rt.retry, rt.held)
        raise
