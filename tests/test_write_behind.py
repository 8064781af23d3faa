"""Write-behind: a trajectory's last batch committed on a background thread while the next
task generates, the job held (its lease renewed) until then (``workers/jobqueue/write_behind.py``)."""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import select

from stepq.assembly import worker_runtime
from stepq.migrations import upgrade
from stepq.models import Database, Rollout, jobs
from stepq.models.work import ROLLOUT_WORK
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.jobqueue.held_jobs import HeldJobs
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.jobqueue.write_behind import WriteBehind
from stepq.workers.labelling.rollout_handler import ROLLOUTS, run_work_items
from tests.pipeline_checks import assert_exact


def test_a_job_is_held_until_its_commit_ran_and_close_drains() -> None:
    held = HeldJobs()
    writer = WriteBehind(held)
    gate, done = threading.Event(), []
    writer.submit(ROLLOUTS, 7, lambda: (gate.wait(10), done.append(7)))
    writer.submit(ROLLOUTS, 8, lambda: done.append(8))
    assert held.now() == {ROLLOUTS: [7, 8]}, "held (renewed) while waiting to be committed"
    with held.holding(ROLLOUTS, [7]):  # a task holding the same job: counted, not a set
        pass
    assert held.now() == {ROLLOUTS: [7, 8]}, "the task's end does not drop what the writer holds"
    gate.set()
    writer.close()
    assert done == [7, 8], "in order, and close waited for both"
    assert held.now() == {}


def test_a_commit_that_raises_releases_its_job_and_the_thread_goes_on() -> None:
    held = HeldJobs()
    writer = WriteBehind(held)
    done: list[int] = []

    def broken() -> None:
        raise RuntimeError("database gone")

    writer.submit(ROLLOUTS, 1, broken)
    writer.submit(ROLLOUTS, 2, lambda: done.append(2))
    writer.drain()
    assert done == [2] and held.now() == {}, "the failed one's lease is left to expire"
    writer.close()


def _setup(db: Database, budget: str | None = None) -> list[int]:
    synth_set(db, "wb", problems=6, seed=3)
    configure_annotation(db, "wb", 4, budget=budget)
    with db.session() as s:
        return jobs.pending_ids(s, ROLLOUT_WORK, 100)


def _rollouts(db: Database) -> set[tuple[int, int, int, int, int]]:
    with db.session() as s:
        columns = (Rollout.trajectory_id, Rollout.prefix_len, Rollout.sample_idx, Rollout.seed, Rollout.reward)
        return {tuple(r) for r in s.execute(select(*columns))}  # type: ignore[misc]


def test_exhaustive_last_batches_are_written_behind_exactly(any_db: Database, tmp_path: Path) -> None:
    """The task returns with its items "writing"; once drained they are done with exactly
    the rollouts a synchronous worker writes on a copy of the set (same seeds, nothing twice)."""
    ids = _setup(any_db)
    rt = worker_runtime(any_db, WorkerOptions(name="wb", write_behind=True))
    outcomes = run_work_items(rt, ids[:3]) | run_work_items(rt, ids[3:])
    assert {o.status for o in outcomes.values()} == {"writing"}
    assert rt.writer is not None
    rt.writer.drain()
    assert rt.busy_items == 0, "nothing held once written"
    rt.close()
    with any_db.session() as s:
        assert jobs.pending_ids(s, ROLLOUT_WORK, 100) == []
    assert_exact(any_db, "wb", 4)
    url = f"sqlite:///{tmp_path / 'sync.db'}"
    upgrade(url)
    copy = Database(url)
    sync = worker_runtime(copy, WorkerOptions(name="sync"))
    assert {o.status for o in run_work_items(sync, _setup(copy)).values()} == {"done"}
    sync.close()
    assert _rollouts(copy) == _rollouts(any_db)
    copy.dispose()


def test_an_adaptive_budget_is_written_in_the_task(sqlite: Database) -> None:
    """Each adaptive round's outcomes decide the next: nothing is left to the writer."""
    ids = _setup(sqlite, budget="adaptive")
    rt = worker_runtime(sqlite, WorkerOptions(name="wb", write_behind=True))
    assert {o.status for o in run_work_items(rt, ids).values()} == {"done"}
    rt.close()


def test_closing_the_runtime_commits_what_waits(sqlite: Database) -> None:
    ids = _setup(sqlite)
    rt = worker_runtime(sqlite, WorkerOptions(name="wb", write_behind=True))
    run_work_items(rt, ids)
    rt.close()  # a stopping worker: drained before its heartbeat stops
    with sqlite.session() as s:
        assert jobs.pending_ids(s, ROLLOUT_WORK, 100) == []
    assert_exact(sqlite, "wb", 4)
