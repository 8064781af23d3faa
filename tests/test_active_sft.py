"""bench_active's generative judge (``bench/experiments/active_sft.py``): a round's judge is a
training run of ``--method sft``, and the priority round's workers score with exactly the model
the benchmark evaluates.

The benchmark's curves are stepq's own judge at work only if the priorities the scoring jobs
write are the ones the evaluated judge's step scores give (``score=logprob``: one greedy
answer, P(Positive) at its verdict), not another judge's or another reading of it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select

from bench.experiments import active_sft
from stepq.assembly import worker_runtime
from stepq.migrations import upgrade
from stepq.models import Database, ProblemSet, Rollout, RolloutWork, queries
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.priority.scoring_handler import SCORINGS
from stepq.workers.priority.strategies import parse_strategy, priority

TINY = active_sft.SFTSettings(width=64, layers=1, pretrain_problems=20, pretrain_steps=4, steps=6, batch=4)


def test_the_round_judge_is_an_sft_run_and_the_workers_score_with_it(tmp_path: Path) -> None:
    upgrade(f"sqlite:///{tmp_path / 'pool.db'}")
    db = Database(f"sqlite:///{tmp_path / 'pool.db'}")
    synth_set(db, "pool", problems=24, seed=5, error_rate=0.3, recovery_rate=0.1, numbers="small")
    configure_annotation(db, "pool", 4, priority="random:seed=0")

    def spent() -> int:
        with db.session() as s:
            return int(s.scalar(select(func.count(Rollout.id))) or 0)

    run_in_process(db, worker_runtime(db, WorkerOptions(batch_rollouts=16, name="t")), stop=lambda: spent() >= 120)
    rows = active_sft.round_rows(db, "pool", seed=0, round_no=1)
    assert rows and all(r["label"] in ("Positive", "Negative") for r in rows)
    base = active_sft.build_backbone(tmp_path, TINY, seed=0)
    run_id = active_sft.round_judge(db, base, rows, TINY, seed=0)
    with db.session() as s:
        run = queries.get_run(s, run_id)
        assert (run.method, run.status, run.global_step) == ("sft", "done", TINY.steps)

    strategy = f"uncertainty:run={run_id},{active_sft.SCORE}"
    configure_annotation(db, "pool", 4, priority=strategy)
    run_in_process(db, worker_runtime(db, WorkerOptions(name="scorer")), kinds=[SCORINGS])

    judge = active_sft.load_judge(db, run_id)  # what the benchmark evaluates
    with db.session() as s:
        set_id = s.scalar(select(ProblemSet.id).where(ProblemSet.name == "pool"))
        waiting = queries.waiting_in_range(s, set_id, 0, 10**9)
        written = dict(s.execute(select(RolloutWork.id, RolloutWork.priority)).all())
    assert waiting, "some trajectories still wait: the round had something to order"
    scores = judge.score_solutions([(w.question, w.chunks) for w in waiting])
    ordered = parse_strategy(strategy)
    expected = [priority(ordered, w.trajectory_id, sc, w.outcome) for w, sc in zip(waiting, scores, strict=True)]
    assert [written[w.work_id] for w in waiting] == pytest.approx(expected)
    assert len({round(p, 6) for p in expected}) > 1, "the judge's scores vary: a constant would prove nothing"
    db.dispose()
