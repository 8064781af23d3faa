"""The same task code in-process, on SQLite and PostgreSQL: exactness and incrementality."""

from __future__ import annotations

from sqlalchemy import func, select

from models import Database, Rollout, queries
from tests.pipeline_checks import assert_exact, label_accuracy
from workers.annotate import WorkerOptions, WorkerRuntime
from workers.embedded import run_in_process
from workers.synth import synth_set


def _annotate(db: Database, name: str, m: int) -> None:
    with db.session() as s:
        pset = queries.get_set(s, name)
        pset.rollouts_per_prefix = m
        s.flush()
        queries.plan_work(s, pset.id)


def _runtime(db: Database) -> WorkerRuntime:
    return WorkerRuntime(db, WorkerOptions(batch_rollouts=32, name="test"))


def test_in_process_run_is_exact_and_rerun_is_a_no_op(any_db: Database) -> None:
    synth_set(any_db, "s", problems=12, seed=3)
    _annotate(any_db, "s", 4)
    outcomes = run_in_process(any_db, _runtime(any_db))
    assert outcomes == {"done": 12}
    total = assert_exact(any_db, "s", 4)
    assert run_in_process(any_db, _runtime(any_db)) == {}
    with any_db.session() as s:
        assert s.scalar(select(func.count(Rollout.id))) == total


def test_new_problems_and_higher_budget_add_only_what_is_missing(any_db: Database) -> None:
    synth_set(any_db, "s", problems=5, seed=3)
    _annotate(any_db, "s", 2)
    run_in_process(any_db, _runtime(any_db))
    with any_db.session() as s:
        before = {r.id: (r.trajectory_id, r.prefix_len, r.sample_idx, r.text) for r in s.scalars(select(Rollout))}
    report = synth_set(any_db, "s", problems=8, seed=3)
    assert (report.new_problems, report.new_trajectories) == (3, 3)
    _annotate(any_db, "s", 3)
    assert run_in_process(any_db, _runtime(any_db)) == {"done": 8}
    assert_exact(any_db, "s", 3)
    with any_db.session() as s:
        after = {r.id: (r.trajectory_id, r.prefix_len, r.sample_idx, r.text) for r in s.scalars(select(Rollout))}
    assert all(after[i] == row for i, row in before.items()), "earlier rollouts untouched"


def test_rollouts_are_deterministic_across_databases(sqlite: Database, pg: Database) -> None:
    texts = []
    for db in (sqlite, pg):
        synth_set(db, "d", problems=4, seed=11)
        _annotate(db, "d", 3)
        run_in_process(db, _runtime(db))
        with db.session() as s:
            texts.append(
                sorted((r.prefix_len, r.sample_idx, r.seed, r.text, r.reward) for r in s.scalars(select(Rollout)))
            )
    assert texts[0] == texts[1]


def test_labels_track_ground_truth_in_process(sqlite: Database) -> None:
    synth_set(sqlite, "t", problems=60, seed=5)
    _annotate(sqlite, "t", 16)
    run_in_process(sqlite, _runtime(sqlite))
    wrong_negative, right_positive, _, _ = label_accuracy(sqlite, "t")
    assert wrong_negative >= 0.9 and right_positive >= 0.9


def test_a_failing_backend_marks_work_failed_after_max_attempts(sqlite: Database) -> None:
    synth_set(sqlite, "f", problems=2, seed=1)
    _annotate(sqlite, "f", 2)

    class Broken:
        name = "broken"
        generator = "broken"

        def generate(self, requests, params):  # type: ignore[no-untyped-def]
            raise RuntimeError("GPU fell off the bus")

        def close(self) -> None:
            pass

    rt = WorkerRuntime(sqlite, WorkerOptions(max_attempts=2, name="t"), backend_override=Broken())
    outcomes = run_in_process(sqlite, rt)
    assert outcomes == {"retry": 2, "failed": 2}
    with sqlite.session() as s:
        assert queries.work_counts(s) == {"failed": 2}
        assert queries.retry_failed(s) == 2
