"""What ``stepq status`` reports: rates over the real elapsed time, live/busy/idle workers."""

from __future__ import annotations

import time

from stepq.assembly import worker_runtime
from stepq.models import Database, jobs, queries
from stepq.models.work import ROLLOUT_WORK
from stepq.status import collect, render
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.labelling.rollout_handler import ROLLOUTS
from tests.helpers import annotated_set


def test_rate_and_eta_use_the_real_elapsed_time(any_db: Database) -> None:
    synth_set(any_db, "r", problems=20, seed=1)
    configure_annotation(any_db, "r", 4)
    sampled_at = time.time() - 10.0
    with any_db.session() as s:
        queries.record_progress(s, sampled_at)  # the dispatcher's sample, 10 s ago: 0 rollouts
    half = worker_runtime(any_db, WorkerOptions(name="t"))
    with any_db.session() as s:
        ids = jobs.pending_ids(s, ROLLOUT_WORK, 10)
    from stepq.workers.labelling.rollout_handler import run_work_items

    run_work_items(half, ids)
    before = time.time()
    report = collect(any_db)
    after = time.time()
    (row,) = report["sets"]
    # the rate is the rollouts over the real time since the sample (10 s plus the run itself)
    low, high = row["rollouts_done"] / (after - sampled_at), row["rollouts_done"] / (before - sampled_at)
    assert 0.99 * low <= row["rollouts_per_s"] <= 1.01 * high, (row["rollouts_per_s"], low, high)
    expected = row["rollouts_per_s"]
    left = row["rollouts_planned"] - row["rollouts_done"]
    assert left > 0 and abs(row["eta_s"] - left / expected) <= 0.1 * left / expected + 1
    run_in_process(any_db, half)
    (row,) = collect(any_db)["sets"]
    assert row["eta_s"] == 0 and row["rollouts_done"] == row["rollouts_planned"]


def test_no_recent_sample_means_no_rate_rather_than_a_wrong_one(any_db: Database) -> None:
    synth_set(any_db, "q", problems=3, seed=1)
    configure_annotation(any_db, "q", 4)
    (row,) = collect(any_db)["sets"]
    assert row["rollouts_per_s"] == 0 and row["eta_s"] is None


def test_live_busy_and_idle_workers(pg: Database) -> None:
    idle = worker_runtime(pg, WorkerOptions(name="idle")).start()
    busy = worker_runtime(pg, WorkerOptions(name="busy"))
    gone = worker_runtime(pg, WorkerOptions(name="gone")).start()
    gone.close()  # a clean exit: not live any more
    try:
        with busy.held.holding(ROLLOUTS, [1, 2]):
            busy.start()
            report = collect(pg)
    finally:
        idle.close()
        busy.close()
    workers = {w["label"]: w for w in report["workers"]}
    assert set(workers) == {"idle", "busy"}
    assert workers["busy"]["busy_items"] == 2 and workers["idle"]["busy_items"] == 0
    assert "workers: 2 live (1 busy, 1 idle)" in render(report)


def test_tokens_spent_per_labelled_chunk_and_saved_by_the_budget(any_db: Database) -> None:
    """Status counts the generated tokens (on PostgreSQL from the trigger-kept counters) and
    estimates the tokens the adaptive budget did not spend at the set's mean per rollout."""
    from sqlalchemy import text

    annotated_set(
        any_db, "t", m=8, problems=12, seed=3, error_rate=0.3, budget="adaptive", worker="t", batch_rollouts=128
    )
    with any_db.engine.connect() as conn:
        tokens, prompt, rollouts = conn.execute(
            text("SELECT sum(tokens), sum(prompt_tokens), count(*) FROM rollouts")
        ).one()
    (row,) = collect(any_db)["sets"]
    assert row["tokens"] == tokens > 0 and row["rollouts_done"] == rollouts
    assert row["tokens_per_labelled_chunk"] == round(tokens / row["labelled_chunks"], 1)
    assert row["prompt_tokens"] == prompt > tokens, "the contexts, not what was generated"
    assert row["prompt_tokens_per_labelled_chunk"] == round(prompt / row["labelled_chunks"], 1)
    assert row["rollouts_saved"] > 0, "the adaptive budget saved rollouts on this set"
    assert row["tokens_saved_estimate"] == round(row["rollouts_saved"] * tokens / rollouts)
    table = render(collect(any_db), verbose=True)  # the savings columns are -v (the default fits 100)
    assert "~tokens saved" in table.splitlines()[0]


def test_the_status_table_fits_100_columns_and_verbose_shows_every_one(sqlite: Database) -> None:
    """`stepq status` was ~190 characters wide: the default table fits 100 (a rule by its
    name), `-v` shows every column, and the details stay in --json."""
    from stepq.status import COLUMNS, COMPACT

    synth_set(sqlite, "a-long-set-name-x", problems=30, seed=3, error_rate=0.3)
    configure_annotation(sqlite, "a-long-set-name-x", 16, rule="rel-effective:alpha=0.4", budget="adaptive")
    run_in_process(sqlite, worker_runtime(sqlite, WorkerOptions(name="t")))
    with sqlite.engine.begin() as conn:  # a long error message, as a failed item keeps it
        from sqlalchemy import text

        conn.execute(text("UPDATE rollout_work SET state = 'failed', last_error = :e WHERE id = 1"), {"e": "y" * 500})
    report = collect(sqlite)
    compact = render(report)
    assert max(len(line) for line in compact.splitlines()) <= 100, compact
    assert compact.splitlines()[0].split() == list(COMPACT)
    assert "last error: yyy" in compact
    assert "rel-effective " in compact and "alpha=0.4" not in compact
    full = render(report, verbose=True)
    assert full.splitlines()[0].split()[:4] == ["set", "M", "rule", "budget"] and "~tokens" in full
    assert len(COLUMNS) > len(COMPACT) and "rel-effective:alpha=0.4" in full


def test_done_percent_is_one_figure_in_status_metrics_and_the_documented_sql(any_db: Database) -> None:
    """Three "percent done" figures disagreed at one moment (status 24.8 while its rollouts
    column read 8.3%, the documented SQL 13.7): under an adaptive budget, mid-run, they agree."""
    import re
    from pathlib import Path

    from sqlalchemy import text

    from stepq.metrics import StepqCollector
    from stepq.status import done_percent

    synth_set(any_db, "p", problems=24, seed=3, error_rate=0.3)
    configure_annotation(any_db, "p", 8, budget="adaptive")
    rt = worker_runtime(any_db, WorkerOptions(name="t", batch_rollouts=128))
    from stepq.workers.labelling.rollout_handler import run_work_items

    with any_db.session() as s:
        run_work_items(rt, jobs.pending_ids(s, ROLLOUT_WORK, 10))
    report = collect(any_db)
    (row,) = report["sets"]
    assert row["rollouts_saved"] > 0 and 0 < row["done_percent"] < 100, row
    drawn, to_draw = row["rollouts_done"], row["rollouts_planned"] - row["rollouts_saved"]
    assert row["done_percent"] == done_percent(drawn, row["rollouts_planned"], row["rollouts_saved"])
    line = render(report).splitlines()[1].split()
    assert f"{drawn}/{to_draw}" in line and f"{row['done_percent']:.1f}" in line, line
    assert abs(100 * drawn / to_draw - float(line[line.index(f"{drawn}/{to_draw}") + 1])) < 0.06
    metric = {
        f.name: f.samples[0].value
        for f in StepqCollector(any_db, lambda: 0).collect()
        if f.name == "stepq_done_percent"
    }
    assert metric == {"stepq_done_percent": row["done_percent"]}
    docs = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    query = re.search(r"```sql\n(SELECT problem_set, rollouts_done.*?AS pct_done.*?);\n```", docs, re.S)
    assert query is not None, "the documented done % query"
    with any_db.engine.connect() as conn:
        pct = conn.execute(text(query.group(1))).mappings().one()["pct_done"]
    assert float(pct) == row["done_percent"]
    run_in_process(any_db, rt)
    (row,) = collect(any_db)["sets"]
    assert row["done_percent"] == 100.0 and row["state"] == "done"


def test_a_set_never_annotated_is_not_started_not_finished(any_db: Database) -> None:
    """It showed ETA 0m00s and stepq_eta_seconds 0, as if finished."""
    from stepq.metrics import StepqCollector

    synth_set(any_db, "fresh", problems=3, seed=1)
    report = collect(any_db)
    (row,) = report["sets"]
    assert row["state"] == "not started" and row["eta_s"] is None and row["done_percent"] is None
    line = render(report).splitlines()[1]
    assert "not started" in line and "0m00s" not in line
    names = {f.name for f in StepqCollector(any_db, lambda: 0).collect() if f.samples}
    assert "stepq_eta_seconds" not in names and "stepq_done_percent" not in names


def test_status_says_whether_a_dispatcher_runs_and_why_workers_idle(any_db: Database) -> None:
    from stepq.workers.jobqueue.dispatcher import Dispatcher
    from tests.helpers import outlets

    synth_set(any_db, "w", problems=3, seed=1)
    configure_annotation(any_db, "w", 2)
    idle = worker_runtime(any_db, WorkerOptions(name="idle")).start()
    try:
        text = render(collect(any_db))
        assert "dispatcher: none running" in text
        assert "1 live workers idle: 3 work items wait and nothing publishes them: start 'stepq dispatch'" in text
        dispatcher = Dispatcher(any_db, outlets(lambda ids: None), name="d@host:1")
        assert dispatcher.acquire()
        first = collect(any_db)["dispatcher"]
        assert dispatcher.acquire()  # a renewal keeps its start
        assert collect(any_db)["dispatcher"]["since"] == first["since"] is not None
        text = render(collect(any_db))
        assert "dispatcher: d@host:1 since " in text and "nothing publishes" not in text
    finally:
        idle.close()
