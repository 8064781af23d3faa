"""The one job runner, through a kind of work that exists only here: a table with the
``LeasedJob`` columns, its ``JobTable``, a handler, and an entry in the kinds the process runs.

Nothing else is written for it: the runner claims, holds and settles its jobs, the dispatcher
publishes them and expires their leases under its retry policy, the in-process runner and the
Celery app take it like any other kind.  The queue's lifecycle (done, retried, failed for
good, handed back on a stop, skipped when another holds it, a lost lease) runs here in the
fast tier, on an in-memory SQLite database (migrated on its one connection).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from sqlalchemy import ForeignKey, Integer, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from stepq.assembly import worker_runtime
from stepq.migrations import upgrade
from stepq.models import Database, jobs
from stepq.models.errors import ConfigError, LeaseLost
from stepq.models.jobs import JobTable, LeasedJob
from stepq.models.problems import ProblemSet
from stepq.workers.celery_app import create_app
from stepq.workers.celery_options import CeleryOptions
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.job_kind import JobKind, RetryPolicy
from stepq.workers.jobqueue.runner import Claimed, run_jobs
from stepq.workers.jobqueue.runtime import WorkerOptions, WorkerRuntime
from stepq.workers.kinds import KINDS

pytestmark = pytest.mark.unit


class ToyBase(DeclarativeBase):
    pass


class Square(LeasedJob, ToyBase):
    """A toy job: square ``n``."""

    __tablename__ = "toy_squares"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    problem_set_id: Mapped[int] = mapped_column(ForeignKey(ProblemSet.id))
    n: Mapped[int] = mapped_column(Integer)
    result: Mapped[int | None] = mapped_column(Integer, nullable=True)


SQUARES = JobTable(
    "toy_squares",
    Square,
    set_of=lambda: Square.problem_set_id,
    in_set=lambda set_id: Square.problem_set_id == set_id,
)


def square(rt: WorkerRuntime, claimed: Claimed) -> None:
    """The handler: only the work, and how each job ended."""
    for job_id in claimed.ids:
        with rt.db.session() as s:
            n = s.get_one(Square, job_id).n
            if n < 0:
                claimed.fail(job_id, ValueError(f"{n} is negative"))
                continue
            if n == 13:
                claimed.fail(job_id, ConfigError("13 is refused for good"))
                continue
            claimed.finish(s, job_id, result=n * n)
        claimed.record(job_id, "done")


TOY = JobKind(SQUARES, "stepq.test.square", square, retry=RetryPolicy(max_attempts=3, backoff_s=0.0))


@pytest.fixture
def memory_db() -> Iterator[Database]:
    db = Database("sqlite://")
    with db.engine.begin() as conn:  # the migrated schema (views too), then the toy table
        upgrade("sqlite://", connection=conn)
    ToyBase.metadata.create_all(db.engine)
    with db.session() as s:
        s.add(ProblemSet(name="toy"))
    yield db
    db.dispose()


def _add(db: Database, *numbers: int) -> list[int]:
    with db.session() as s:
        set_id = s.scalars(select(ProblemSet.id)).one()
        rows = [Square(problem_set_id=set_id, n=n) for n in numbers]
        s.add_all(rows)
        s.flush()
        return [r.id for r in rows]


def _rows(db: Database) -> dict[int, tuple[str, int | None, int]]:
    with db.session() as s:
        return {r.n: (r.state, r.result, r.attempts) for r in s.scalars(select(Square))}


def _runtime(db: Database) -> WorkerRuntime:
    return worker_runtime(db, WorkerOptions(name="toy", lease_ttl_s=60), judge_factory=lambda *_: None)


def test_a_toy_kind_runs_to_the_end_in_process_with_its_own_retry_policy(memory_db: Database) -> None:
    _add(memory_db, 2, 3, -1, 13)
    rt = _runtime(memory_db)
    outcomes = run_in_process(memory_db, rt, kinds=[TOY])
    rows = _rows(memory_db)
    assert rows[2] == ("done", 4, 1) and rows[3] == ("done", 9, 1), "the result committed with done, in one attempt"
    assert rows[-1] == ("failed", None, 3), "a transient error: retried up to the kind's 3 attempts"
    assert rows[13] == ("failed", None, 1), "a permanent error: failed at once"
    assert outcomes == {"done": 2, "retry": 2, "failed": 2}


def test_the_runner_skips_what_another_holds_and_hands_back_on_a_stop(memory_db: Database) -> None:
    first, second = _add(memory_db, 4, 5)
    with memory_db.session() as s:
        assert jobs.claim(s, SQUARES, second, "someone-else", 60)
    rt = _runtime(memory_db)
    assert run_jobs(rt, TOY, [first, second]) == {first: "done", second: "skipped"}
    assert run_jobs(rt, TOY, [first]) == {first: "skipped"}, "a redelivered message is a no-op"

    (third,) = _add(memory_db, 6)

    def stops_first(rt: WorkerRuntime, claimed: Claimed) -> None:
        rt.request_stop()  # asked to stop: the handler returns at once, leaving its job unsettled

    rt2 = _runtime(memory_db)
    assert run_jobs(rt2, replace(TOY, handler=stops_first), [third]) == {third: "handed-back"}
    assert _rows(memory_db)[6] == ("pending", None, 0), "handed back unharmed: no attempt counted"
    assert run_jobs(rt2, TOY, [third]) == {third: "handed-back"}, "a stopping process claims nothing"
    assert _rows(memory_db)[6] == ("pending", None, 0)


def test_an_error_escaping_the_handler_fails_what_it_claimed_and_a_lost_lease_writes_nothing(
    memory_db: Database,
) -> None:
    first, second = _add(memory_db, 7, 8)

    def crashes(rt: WorkerRuntime, claimed: Claimed) -> None:
        raise RuntimeError("connection reset")

    with pytest.raises(RuntimeError, match="connection reset"):
        run_jobs(_runtime(memory_db), replace(TOY, handler=crashes), [first])
    with memory_db.session() as s:
        row = s.get_one(Square, first)
        assert (row.state, row.attempts) == ("pending", 1) and "connection reset" in (row.last_error or "")

    def stolen(rt: WorkerRuntime, claimed: Claimed) -> None:
        (job_id,) = claimed.ids
        with rt.db.session() as s:  # another worker took the job over meanwhile
            s.execute(Square.__table__.update().where(Square.id == job_id).values(lease_owner="thief"))
        try:
            with rt.db.session() as s:
                s.execute(Square.__table__.update().where(Square.id == job_id).values(result=-1))
                claimed.finish(s, job_id, result=64)
        except LeaseLost:
            claimed.record(job_id, "lost")

    assert run_jobs(_runtime(memory_db), replace(TOY, handler=stolen), [second]) == {second: "lost"}
    with memory_db.session() as s:
        row = s.get_one(Square, second)
        assert (row.state, row.result, row.lease_owner) == ("running", None, "thief"), "its write rolled back"


def test_the_dispatcher_expires_a_toy_lease_under_the_kinds_policy(memory_db: Database) -> None:
    from stepq.workers.jobqueue.dispatcher import Dispatcher
    from stepq.workers.jobqueue.job_kind import Outlet

    (job,) = _add(memory_db, 9)
    published: list[int] = []
    dispatcher = Dispatcher(memory_db, [Outlet(replace(TOY, retry=RetryPolicy(max_attempts=2)), published.extend)])
    assert dispatcher.cycle().published == 1 and published == [job]
    for owner in ("dead", "dead-again"):
        with memory_db.session() as s:
            assert jobs.claim(s, SQUARES, job, owner, ttl=-1)
        dispatcher.cycle()
    assert _rows(memory_db)[9] == ("failed", None, 2), "two expired leases: given up at the kind's 2 attempts"


def test_the_celery_app_registers_a_task_for_the_toy_kind() -> None:
    app = create_app(CeleryOptions("memory://"), kinds=(*KINDS, TOY))
    assert {kind.task_name for kind in (*KINDS, TOY)} <= set(app.tasks)


def test_the_openai_key_comes_from_the_settings_to_the_backend_and_is_never_printed() -> None:
    """``STEPQ_OPENAI_API_KEY`` is read once, into the settings (so the configuration reference
    lists it), and handed down to the worker's backends; no repr shows it."""
    from stepq.assembly import configured_runtime
    from stepq.settings import Settings

    settings = Settings.from_env({"STEPQ_OPENAI_API_KEY": "sk-not-printed"})
    rt = configured_runtime(settings, Database("sqlite://"), "w")
    assert "sk-not-printed" not in repr(settings) and "sk-not-printed" not in repr(rt.engines)
    backend = rt.engines.backend_named("openai", {"base_url": "http://127.0.0.1:9/v1", "model": "m"})
    own = rt.engines.backend_named("openai", {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key": "the-sets"})
    try:
        assert backend.api_key == "sk-not-printed"  # type: ignore[attr-defined]
        assert own.api_key == "the-sets", "a backend config's own key wins"  # type: ignore[attr-defined]
    finally:
        rt.close()


def test_a_worker_whose_jobs_fail_one_after_another_stops_taking_work_and_says_why(memory_db: Database) -> None:
    """A backend that cannot generate fails every job, each an attempt spent, while the worker
    looks alive.  After ``unhealthy_after`` failures in a row (transient ones: a permanent
    error is the job's, a job done resets the count) it claims nothing more, its heartbeat
    says why, status shows it and the broker bound no longer counts it."""
    from stepq.models import queries
    from stepq.status import collect, render

    ids = _add(memory_db, 1, -1, 13, -2, -3, 4)
    rt = worker_runtime(memory_db, WorkerOptions(name="sick", unhealthy_after=3), judge_factory=lambda *_: None)
    rt.start()
    try:
        assert run_jobs(rt, TOY, ids[:3]) == {ids[0]: "done", ids[1]: "retry", ids[2]: "failed"}
        assert rt.health.healthy, "one transient failure, and a permanent one (the job's fault)"
        assert run_jobs(rt, TOY, ids[3:5]) == {ids[3]: "retry", ids[4]: "retry"}
        assert not rt.health.healthy and "ValueError: -3 is negative" in (rt.health.reason or "")
        assert run_jobs(rt, TOY, [ids[5]]) == {ids[5]: "handed-back"}, "claims nothing once unhealthy"
        assert _rows(memory_db)[4] == ("pending", None, 0), "no attempt spent on it"
        rt.heartbeat.beat()
        with memory_db.session() as s:
            (row,) = queries.live_workers(s, 0.0)
            assert row["unhealthy"] == rt.health.reason
            assert queries.live_worker_count(s, 0.0) == 0, "the broker bound counts only workers that take work"
        shown = render(collect(memory_db))
        assert "1 unhealthy" in shown and "worker sick takes no work: 3 jobs in a row failed" in shown
    finally:
        rt.close()
