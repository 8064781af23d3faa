"""The trigger-kept progress counters equal what the tables hold, after every kind of write.

``stepq status`` on PostgreSQL reads these counters instead of scanning rollouts and labels;
here they are compared with the ``annotation_progress`` view (which counts rows) after a
workload that touches every counted table: ingestion, annotation, adaptive budgets, raised M,
relabelling, regrading, failures and retries, re-segmentation and updated problems.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from stepq.assembly import worker_runtime
from stepq.models import Database, queries
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.policy_sampling import resegment_set
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.grading.grader import Grader
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.labelling.labels import parse_rule
from stepq.workers.labelling.qvalues import relabel_set
from stepq.workers.labelling.regrade import regrade_set
from tests.helpers import outlets

FIELDS = (
    "problems",
    "trajectories",
    "trajectories_done",
    "chunks",
    "rollouts_done",
    "rollouts_planned",
    "rollouts_saved",
    "labelled_chunks",
)


def _assert_counters_match_the_tables(db: Database) -> None:
    with db.session() as s:
        counted = {r["problem_set"]: r for r in queries.progress(s)}
        work = queries.work_counts(s)
        view = {r["problem_set"]: r for r in s.execute(text("SELECT * FROM annotation_progress")).mappings()}
        states = dict(s.execute(text("SELECT state, count(*) FROM rollout_work GROUP BY state")).all())
        tokens = dict(
            s.execute(
                text(
                    "SELECT ps.name, sum(r.tokens) FROM rollouts r JOIN trajectories t ON t.id = r.trajectory_id "
                    "JOIN problems p ON p.id = t.problem_id JOIN problem_sets ps ON ps.id = p.problem_set_id "
                    "GROUP BY ps.name"
                )
            ).all()
        )
        prompt_tokens = dict(
            s.execute(
                text(
                    "SELECT ps.name, sum(r.prompt_tokens) FROM rollouts r "
                    "JOIN trajectories t ON t.id = r.trajectory_id "
                    "JOIN problems p ON p.id = t.problem_id JOIN problem_sets ps ON ps.id = p.problem_set_id "
                    "GROUP BY ps.name"
                )
            ).all()
        )
        per_set_states = {
            (name, state): n
            for name, state, n in s.execute(
                text(
                    "SELECT ps.name, w.state, count(*) FROM rollout_work w JOIN trajectories t "
                    "ON t.id = w.trajectory_id JOIN problems p ON p.id = t.problem_id "
                    "JOIN problem_sets ps ON ps.id = p.problem_set_id GROUP BY ps.name, w.state"
                )
            )
        }
    assert set(counted) == set(view)
    for name, row in view.items():
        assert {f: counted[name][f] for f in FIELDS} == {f: int(row[f]) for f in FIELDS}, name
        share = row["positive_share"]
        assert (counted[name]["positive_share"] is None) == (share is None)
        if share is not None:
            assert abs(counted[name]["positive_share"] - float(share)) < 1e-9
        assert counted[name]["tokens"] == int(tokens.get(name) or 0), name
        assert counted[name]["prompt_tokens"] == int(prompt_tokens.get(name) or 0), name
        for state, n in counted[name]["work"].items():
            assert n == per_set_states.get((name, state), 0), (name, state)
    assert work == {k: int(v) for k, v in states.items()}


def test_counters_follow_every_write(pg: Database, tmp_path: Path) -> None:
    synth_set(pg, "a", problems=12, seed=1)
    synth_set(pg, "b", problems=10, seed=2, trajectories_per_problem=2)
    _assert_counters_match_the_tables(pg)
    configure_annotation(pg, "a", 4)
    configure_annotation(pg, "b", 8, budget="adaptive")
    _assert_counters_match_the_tables(pg)  # pending items counted
    rt = worker_runtime(pg, WorkerOptions(name="t", batch_rollouts=8))
    run_in_process(pg, rt)
    _assert_counters_match_the_tables(pg)
    configure_annotation(pg, "a", 6)  # raised M: done -> pending, more rollouts
    run_in_process(pg, rt)
    relabel_set(pg, "a", parse_rule("rel-ratio"), make_default=True)
    _assert_counters_match_the_tables(pg)
    with pg.engine.begin() as conn:  # grading "timed out" on some right answers
        conn.execute(
            text(
                "UPDATE rollouts SET reward = 0, grade_method = 'timeout' WHERE id IN "
                "(SELECT id FROM rollouts WHERE reward = 1 ORDER BY id LIMIT 9)"
            )
        )
    grader = Grader()
    try:
        regrade_set(pg, "a", grader)
        regrade_set(pg, "b", grader)
    finally:
        grader.close()
    run_in_process(pg, rt)
    _assert_counters_match_the_tables(pg)
    synth_set(pg, "a", problems=15, seed=1)  # three more problems, unannotated yet
    resegment_set(pg, "a", "blank-lines", export_old=tmp_path / "old.jsonl")
    with pg.session() as s:
        queries.delete_trajectories_of(s, queries.existing_problem_ids(s, queries.get_set(s, "b").id, ["0"]).values())
    _assert_counters_match_the_tables(pg)
    with pg.session() as s:
        queries.recount(s)
    _assert_counters_match_the_tables(pg)


def test_dispatcher_plans_only_flagged_sets(pg: Database) -> None:
    from stepq.workers.jobqueue.dispatcher import Dispatcher

    synth_set(pg, "p", problems=4, seed=1)
    configure_annotation(pg, "p", 2)
    d = Dispatcher(pg, outlets(lambda ids: None))
    assert d.cycle().planned == 0, "annotate planned it; nothing is flagged"
    synth_set(pg, "p", problems=6, seed=1)  # two new trajectories flag the set
    assert d.cycle().planned == 2
    assert d.cycle().planned == 0
