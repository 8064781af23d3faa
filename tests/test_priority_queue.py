"""Work priority through the queue: scoring jobs write what the strategy says (with a real PRM
judge), the dispatcher publishes in that order, sets take turns, aging bounds the wait, new
work is scored by the round's judge, and a later round is never overwritten by an earlier one.
Real workers, kills and re-prioritising under load are in ``test_priority_fleet``."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select, text, update

from stepq.assembly import worker_runtime
from stepq.models import Database, PriorityRound, PriorityScoring, RolloutWork, jobs, queries
from stepq.models.errors import ConfigError, NotFoundError
from stepq.models.work import ROLLOUT_WORK
from stepq.trainer.methods.prm import set_outcomes
from stepq.trainer.prm.model import StepScorer
from stepq.trainer.tiny_model import build_tiny_model
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.dispatcher import Dispatcher, DispatchOptions
from stepq.workers.jobqueue.runner import run_jobs
from stepq.workers.jobqueue.runtime import WorkerOptions, WorkerRuntime
from stepq.workers.kinds import SCORINGS
from stepq.workers.priority.strategies import convincing_wrong, random_priority, uncertainty
from tests.helpers import outlets
from tests.trainer_helpers import prm_recipe, train_records


def _priorities(db: Database, set_name: str) -> dict[int, tuple[float, int | None]]:
    """trajectory id -> (priority, round that placed it)"""
    with db.session() as s:
        set_id = queries.get_set(s, set_name).id
        rows = s.execute(
            select(RolloutWork.trajectory_id, RolloutWork.priority, RolloutWork.priority_round_id).where(
                RolloutWork.problem_set_id == set_id
            )
        )
        return {tid: (p, r) for tid, p, r in rows}


def _next_published(db: Database, limit: int = 1000) -> list[int]:
    """Trajectory ids in the order the dispatcher would publish their work."""
    with db.session() as s:
        ids = jobs.pending_ids(s, ROLLOUT_WORK, limit)
        by_id = dict(s.execute(select(RolloutWork.id, RolloutWork.trajectory_id)).all())
    return [by_id[i] for i in ids]


def _runtime(db: Database) -> WorkerRuntime:
    return worker_runtime(db, WorkerOptions(name="t"))


def test_random_priority_orders_what_is_published(any_db: Database) -> None:
    synth_set(any_db, "r", problems=12, seed=2)
    report = configure_annotation(any_db, "r", 2, priority="random:seed=9")
    assert report.ordered is not None and report.ordered.scoring_jobs == 1
    with any_db.session() as s:
        assert queries.sets_being_scored(s) == {queries.get_set(s, "r").id}
        assert jobs.pending_ids(s, ROLLOUT_WORK, 100, skip_sets=queries.sets_being_scored(s)) == []
    run_in_process(any_db, _runtime(any_db), kinds=[SCORINGS])
    placed = _priorities(any_db, "r")
    assert all(p == pytest.approx(random_priority(9, tid)) for tid, (p, _) in placed.items())
    assert {r for _, r in placed.values()} == {report.ordered.round_id}
    assert _next_published(any_db) == sorted(placed, key=lambda t: -placed[t][0])


def test_a_trained_prm_orders_the_waiting_trajectories(pg: Database, tmp_path: Path) -> None:
    """A PRM trained by stepq scores the waiting trajectories in a scoring job: the priorities
    written are exactly the strategy applied to the judge's own scores (computed here
    independently), and the dispatcher publishes the most uncertain first."""
    synth_set(pg, "o", problems=6, seed=4, trajectories_per_problem=2, error_rate=0.3)
    configure_annotation(pg, "o", 4)
    run_in_process(pg, _runtime(pg))
    base = build_tiny_model(tmp_path / "base", n_positions=512)
    result = train_records(
        pg, "prm", set_outcomes(pg, "o"), "outcomes:o", prm_recipe(base, max_steps=2), tmp_path / "run"
    )
    synth_set(pg, "w", problems=8, seed=5, error_rate=0.3)
    configure_annotation(pg, "w", 2, priority=f"uncertainty:run={result.run_id},threshold=0.4")
    run_in_process(pg, _runtime(pg), kinds=[SCORINGS])
    with pg.session() as s:
        rows = s.execute(
            text(
                "SELECT t.id, p.question, t.outcome FROM trajectories t JOIN problems p ON p.id = t.problem_id "
                "JOIN problem_sets ps ON ps.id = p.problem_set_id WHERE ps.name = 'w' ORDER BY t.id"
            )
        ).all()
        chunks = {tid: [c.text for c in queries.trajectory_chunks(s, tid)] for tid, _, _ in rows}
    scorer = StepScorer.load(result.final_model)
    scores = scorer.score([(q, chunks[tid]) for tid, q, _ in rows])
    placed = _priorities(pg, "w")
    for (tid, _, _), chunk_scores in zip(rows, scores, strict=True):
        assert placed[tid][0] == pytest.approx(uncertainty(chunk_scores, 0.4), abs=1e-5)
    assert len({round(p, 6) for p, _ in placed.values()}) > 1, "the judge tells trajectories apart"
    assert _next_published(pg)[0] == max(placed, key=lambda t: placed[t][0])

    # Another strategy, the same judge: a new round re-orders the same waiting work.
    configure_annotation(pg, "w", 2, priority=f"convincing-wrong:run={result.run_id}")
    run_in_process(pg, _runtime(pg), kinds=[SCORINGS])
    again = _priorities(pg, "w")
    for (tid, _, outcome), chunk_scores in zip(rows, scores, strict=True):
        assert again[tid][0] == pytest.approx(convincing_wrong(chunk_scores, outcome), abs=1e-5)
    assert len({r for _, r in again.values()}) == 1 and next(iter(again.values()))[1] != placed[rows[0][0]][1]


def test_a_judge_that_cannot_order_work_is_refused(sqlite: Database) -> None:
    synth_set(sqlite, "x", problems=3, seed=1)
    with pytest.raises(NotFoundError, match="no training run 42"):
        configure_annotation(sqlite, "x", 2, priority="uncertainty:run=42")
    with pytest.raises(NotFoundError, match="has no finished training run"):
        configure_annotation(sqlite, "x", 2, priority="uncertainty:lineage=nobody")
    with sqlite.session() as s:
        assert queries.get_set(s, "x").priority_strategy == "fifo", "nothing stored"
    with pytest.raises(ConfigError, match="priority-aging must be positive"):
        configure_annotation(sqlite, "x", 2, priority="random", priority_aging_s=0)


def test_sets_take_turns_and_aging_bounds_the_wait(pg: Database) -> None:
    """A large prioritised set does not starve a small plain one: the dispatcher takes one job
    of each in turn.  Within a set, work planned an aging period before goes first whatever
    the priorities."""
    synth_set(pg, "big", problems=20, seed=1)
    synth_set(pg, "small", problems=4, seed=2)
    configure_annotation(pg, "big", 2, priority="random:seed=1", priority_aging_s=100)
    configure_annotation(pg, "small", 2)
    run_in_process(pg, _runtime(pg), kinds=[SCORINGS])
    with pg.session() as s:
        big, small = queries.get_set(s, "big").id, queries.get_set(s, "small").id
        first = jobs.pending_ids(s, ROLLOUT_WORK, 8)
        sets = dict(s.execute(select(RolloutWork.id, RolloutWork.problem_set_id)).all())
    assert [sets[i] for i in first] == [big, small] * 4

    order = _next_published(pg)
    big_order = [t for t in order if _priorities(pg, "big").get(t)]
    lowest = big_order[-1]
    with pg.session() as s:  # the least wanted job was planned long ago: it ages to the front
        s.execute(
            update(RolloutWork)
            .where(RolloutWork.trajectory_id == lowest)
            .values(planned_at=RolloutWork.planned_at - 200, dispatch_key=RolloutWork.dispatch_key - 200)
        )
    assert next(t for t in _next_published(pg) if t in set(big_order)) == lowest


def test_new_work_is_scored_by_the_rounds_judge_and_later_rounds_win(sqlite: Database) -> None:
    synth_set(sqlite, "g", problems=5, seed=3)
    first = configure_annotation(sqlite, "g", 2, priority="random:seed=1").ordered
    assert first is not None
    synth_set(sqlite, "g", problems=9, seed=3)  # four problems more, after the round began
    messages: list[list[int]] = []
    published = outlets(lambda ids: None, scorings=lambda ids: messages.append(list(ids)))
    dispatcher = Dispatcher(sqlite, published, options=DispatchOptions(messages_per_worker=None))
    dispatcher.cycle()  # plans the new work, and the scorings kind gives it a job of the same round
    with sqlite.session() as s:
        scorings = list(s.scalars(select(PriorityScoring).order_by(PriorityScoring.id)))
        assert [j.round_id for j in scorings] == [first.round_id, first.round_id]
        assert scorings[1].work_from_id == scorings[0].work_to_id
    rt = _runtime(sqlite)
    try:  # each published message run as a worker's task runs one
        for ids in messages:
            run_jobs(rt, SCORINGS, ids)
    finally:
        rt.close()
    placed = _priorities(sqlite, "g")
    assert len(placed) == 9 and {r for _, r in placed.values()} == {first.round_id}

    # A second round; then the first round's jobs run again (a stale worker): nothing changes.
    second = configure_annotation(sqlite, "g", 2, priority="random:seed=2").ordered
    assert second is not None
    run_in_process(sqlite, _runtime(sqlite), kinds=[SCORINGS])
    with sqlite.session() as s:
        s.execute(update(PriorityScoring).where(PriorityScoring.round_id == first.round_id).values(state="pending"))
    run_in_process(sqlite, _runtime(sqlite), kinds=[SCORINGS])
    again = _priorities(sqlite, "g")
    assert all(r == second.round_id and p == pytest.approx(random_priority(2, t)) for t, (p, r) in again.items())
    with sqlite.session() as s:
        rounds = list(s.scalars(select(PriorityRound).order_by(PriorityRound.id)))
    assert [(r.strategy, r.judge_run_id) for r in rounds] == [("random:seed=1", None), ("random:seed=2", None)]


def test_fifo_puts_the_set_back_in_plan_order(sqlite: Database) -> None:
    synth_set(sqlite, "f", problems=6, seed=3)
    configure_annotation(sqlite, "f", 2, priority="random:seed=4")
    run_in_process(sqlite, _runtime(sqlite), kinds=[SCORINGS])
    assert _next_published(sqlite) != sorted(_priorities(sqlite, "f"))
    report = configure_annotation(sqlite, "f", 2, priority="fifo").ordered
    assert report is not None and report.reset == 6
    assert _next_published(sqlite) == sorted(_priorities(sqlite, "f"))
    assert {r for _, r in _priorities(sqlite, "f").values()} == {None}


def test_status_and_metrics_show_the_order_and_the_judge_behind_it(pg: Database) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from stepq.metrics import StepqCollector
    from stepq.status import collect, render

    synth_set(pg, "shown", problems=4, seed=1)
    synth_set(pg, "plain", problems=2, seed=2)
    configure_annotation(pg, "plain", 2)
    with pg.session() as s:  # a judge's run, recorded as a finished PRM training
        run_id = queries.create_run(
            s, method="prm", recipe="r", base_model="b", output_dir="/nowhere/prm", host="h", status="done"
        )
    report = configure_annotation(pg, "shown", 2, priority=f"convincing-wrong:run={run_id}").ordered
    assert report is not None
    status = {r["problem_set"]: r["priority"] for r in collect(pg)["sets"]}
    assert status["plain"] == {"strategy": "fifo"}
    assert status["shown"] == {
        "strategy": f"convincing-wrong:run={run_id}",
        "round": report.round_id,
        "judge_run_id": run_id,
        "scoring": {"pending": 1},
        "last_error": None,
    }
    text_report = render(collect(pg))
    assert f"shown: order convincing-wrong:run={run_id} (priority round {report.round_id}, judge: training run" in (
        text_report
    )
    registry = CollectorRegistry()
    registry.register(StepqCollector(pg))
    scraped = generate_latest(registry).decode()
    assert (
        f'stepq_priority_round{{judge_run="{run_id}",set="shown",strategy="convincing-wrong:run={run_id}"}} '
        f"{float(report.round_id)}" in scraped
    )
    assert 'stepq_priority_scoring_jobs{set="shown",state="pending"} 1.0' in scraped

    # The judge's model is on no worker: the scoring job fails for good, says why, and the
    # set's rollouts are published anyway (in plan order), not held back for ever.
    run_in_process(pg, _runtime(pg), kinds=[SCORINGS])
    shown = {r["problem_set"]: r for r in collect(pg)["sets"]}["shown"]["priority"]
    assert shown["scoring"] == {"failed": 1} and "/nowhere/prm/final is not on this worker" in shown["last_error"]
    assert "shown: a scoring job failed: permanent: ConfigError: the judge's model" in render(collect(pg))
    with pg.session() as s:
        assert queries.sets_being_scored(s) == set()
        assert len(jobs.pending_ids(s, ROLLOUT_WORK, 100)) == 6


def _doc_sql(marker: str) -> list[str]:
    """The statements of the ``sql`` block in docs/operations.md that starts with ``marker``."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text(encoding="utf-8")
    for block in doc.split("```sql\n")[1:]:
        body = block.split("```", 1)[0]
        if body.startswith(marker):
            return [statement for statement in body.split(";") if "SELECT" in statement]
    raise AssertionError(f"no sql block starting {marker!r} in docs/operations.md")


def test_the_documented_round_queries_say_what_each_round_cost(pg: Database) -> None:
    synth_set(pg, "cost", problems=10, seed=6)
    configure_annotation(pg, "cost", 4, priority="random:seed=1")
    rt = _runtime(pg)

    def spent() -> int:
        with pg.engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM rollouts")).scalar_one())

    run_in_process(pg, rt, stop=lambda: spent() >= 60)
    at_second = spent()
    assert 0 < at_second < 200
    configure_annotation(pg, "cost", 4, priority="random:seed=2")
    run_in_process(pg, rt)
    total = spent()
    with pg.engine.connect() as conn:
        cost, placed = (conn.execute(text(sql)).mappings().all() for sql in _doc_sql("-- what each priority round"))
        labelled = conn.execute(text("SELECT labelled_chunks FROM annotation_progress")).scalar_one()
    assert [(r["round"], r["problem_set"], r["strategy"]) for r in cost] == [
        (1, "cost", "random:seed=1"),
        (2, "cost", "random:seed=2"),
    ]
    assert [r["rollouts"] for r in cost] == [at_second, total - at_second]
    assert sum(r["labelled_chunks"] for r in cost) == labelled
    assert {r["round"] for r in placed} == {1, 2} and sum(r["trajectories"] for r in placed) == 10


def test_pausing_and_raising_m_keep_the_order(any_db: Database) -> None:
    from tests.pipeline_checks import assert_exact

    synth_set(any_db, "m", problems=6, seed=7)
    configure_annotation(any_db, "m", 2, priority="random:seed=3")
    run_in_process(any_db, _runtime(any_db), kinds=[SCORINGS])
    order = _next_published(any_db)
    assert order == sorted(order, key=lambda t: -random_priority(3, t))
    with any_db.session() as s:
        queries.pause_set(s, "m", True)
    assert _next_published(any_db) == [], "a paused set publishes nothing"
    with any_db.session() as s:
        queries.pause_set(s, "m", False)
    run_in_process(any_db, _runtime(any_db))
    configure_annotation(any_db, "m", 4)  # raised M: the finished work reopens, in its order
    assert _next_published(any_db) == order
    assert {r for _, r in _priorities(any_db, "m").values()} == {1}
    run_in_process(any_db, _runtime(any_db))
    assert_exact(any_db, "m", 4)


def test_a_run_that_made_no_judge_orders_nothing_unless_this_process_builds_its_judges(
    sqlite: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepq.workers.priority import rounds

    synth_set(sqlite, "s", problems=3, seed=1)
    with sqlite.session() as s:
        dpo = queries.create_run(
            s, method="dpo", recipe="r", base_model="b", output_dir="/nowhere/dpo", host="h", status="done"
        )
        own = queries.create_run(
            s, method="mine", recipe="r", base_model="b", output_dir="/nowhere/mine", host="h", status="done"
        )
    with pytest.raises(ConfigError, match=f"training run {dpo} trained a dpo model, not a judge"):
        configure_annotation(sqlite, "s", 2, priority=f"uncertainty:run={dpo}")
    with pytest.raises(ConfigError, match="not a judge"):
        configure_annotation(sqlite, "s", 2, priority=f"uncertainty:run={own}")
    # a process whose workers build that method's judges itself (a benchmark's stand-in) says so
    monkeypatch.setattr(rounds, "_OWN_JUDGE_METHODS", set())
    rounds.accept_judge_method("mine")
    report = configure_annotation(sqlite, "s", 2, priority=f"uncertainty:run={own}").ordered
    assert report is not None and report.judge_run_id == own
    with pytest.raises(ConfigError, match="not a judge"):  # only the method it named
        configure_annotation(sqlite, "s", 2, priority=f"uncertainty:run={dpo}")
