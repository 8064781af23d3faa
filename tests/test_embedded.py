"""The same task code in-process, on SQLite and PostgreSQL: exactness and incrementality."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from stepq.assembly import worker_runtime
from stepq.models import Database, Problem, ProblemSet, Rollout, Trajectory, jobs, queries
from stepq.models.work import ROLLOUT_WORK
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.job_kind import RetryPolicy, with_retry
from stepq.workers.jobqueue.runtime import WorkerOptions, WorkerRuntime
from stepq.workers.kinds import KINDS
from stepq.workers.labelling.labels import parse_rule
from tests.helpers import table_counts
from tests.pipeline_checks import assert_exact, label_accuracy


def _annotate(db: Database, name: str, m: int, **kw: str) -> None:
    configure_annotation(db, name, m, **kw)


def _runtime(db: Database) -> WorkerRuntime:
    return worker_runtime(db, WorkerOptions(batch_rollouts=32, name="test"))


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


def test_rollouts_record_the_context_they_continued(any_db: Database) -> None:
    """Prompt tokens per rollout (the synthetic engine counts words): a later prefix's rollout
    continued a longer context and wrote less; docs/operations.md's query shows it."""
    import re
    from pathlib import Path

    from sqlalchemy import text

    synth_set(any_db, "p", problems=6, seed=3)
    _annotate(any_db, "p", 2)
    run_in_process(any_db, _runtime(any_db))
    with any_db.session() as s:
        assert s.scalar(select(func.count()).select_from(Rollout).where(Rollout.prompt_tokens.is_(None))) == 0
    doc = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    (query,) = re.findall(r"```sql\n(SELECT ps.name AS problem_set, r.prefix_len.*?)```", doc, re.S)
    with any_db.engine.connect() as conn:
        rows = conn.execute(text(query)).all()
    assert [r.prefix_len for r in rows] == sorted(r.prefix_len for r in rows) and len(rows) >= 3
    contexts, generated = [float(r.context) for r in rows], [float(r.generated) for r in rows]
    assert contexts == sorted(contexts) and contexts[0] < contexts[-1], "each prefix adds its chunk"
    assert generated[0] > generated[-1], "and leaves less to write"


def test_labels_track_ground_truth_in_process(sqlite: Database) -> None:
    synth_set(sqlite, "t", problems=60, seed=5)
    _annotate(sqlite, "t", 16)
    run_in_process(sqlite, _runtime(sqlite))
    wrong_negative, right_positive, _, _ = label_accuracy(sqlite, "t")
    assert wrong_negative >= 0.9 and right_positive >= 0.9


def test_a_failing_backend_marks_work_failed_after_max_attempts(sqlite: Database) -> None:
    synth_set(sqlite, "f", problems=2, seed=1)
    _annotate(sqlite, "f", 2)

    policy = _runtime(sqlite).engines.backend_for(queries_set(sqlite, "f"))

    class Broken:  # the set's own policy, as far as any check can tell, until it generates
        name = "broken"
        generator = policy.generator

        def generate(self, requests, params):  # type: ignore[no-untyped-def]
            raise RuntimeError("GPU fell off the bus")

        def close(self) -> None:
            pass

    rt = worker_runtime(sqlite, WorkerOptions(name="t"), backend=Broken())
    started = time.monotonic()
    outcomes = run_in_process(sqlite, rt, kinds=with_retry(KINDS, RetryPolicy(max_attempts=2, backoff_s=0.2)))
    assert outcomes == {"retry": 2, "failed": 2}
    assert time.monotonic() - started >= 0.2, "the retry waited out its backoff"
    with sqlite.session() as s:
        assert queries.work_counts(s) == {"failed": 2}
        assert jobs.retry_failed(s, ROLLOUT_WORK) == 2


def _labels(db: Database, name: str) -> dict[tuple[str, str, int, str], bool]:
    """Every label of the set by (problem, trajectory, chunk, rule): a problem's trajectories
    (siblings) each keep their own, whatever order the rows come in."""
    from sqlalchemy import text

    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT p.external_id, t.source_key, c.idx, l.rule, l.positive FROM chunk_labels l "
                "JOIN chunks c ON c.id = l.chunk_id JOIN trajectories t ON t.id = c.trajectory_id "
                "JOIN problems p ON p.id = t.problem_id JOIN problem_sets s ON s.id = p.problem_set_id "
                "WHERE s.name = :n"
            ),
            {"n": name},
        )
        return {(ext, key, idx, rule): bool(pos) for ext, key, idx, rule, pos in rows}


def test_adaptive_budget_labels_every_chunk_with_fewer_rollouts(any_db: Database) -> None:
    for name, budget in (("ex", "exhaustive"), ("ad", "adaptive")):
        synth_set(any_db, name, problems=30, seed=9, recovery_rate=0.0)
        _annotate(any_db, name, 16, budget=budget)
        run_in_process(any_db, _runtime(any_db))
    with any_db.session() as s:
        rows = {r["problem_set"]: r for r in queries.progress(s)}
    ex, ad = rows["ex"], rows["ad"]
    assert ex["rollouts_saved"] == 0 and ex["rollouts_done"] == ex["rollouts_planned"]
    assert ad["labelled_chunks"] == ad["chunks"] == ex["chunks"]
    assert ad["rollouts_done"] * 4 < ex["rollouts_done"], "Abs-Q needs far fewer rollouts"
    assert ad["rollouts_saved"] == ad["rollouts_planned"] - ad["rollouts_done"]
    ex_labels = {k[:3]: v for k, v in _labels(any_db, "ex").items()}
    ad_labels = {k[:3]: v for k, v in _labels(any_db, "ad").items()}
    assert ad_labels == ex_labels, "without recovery adaptive Abs-Q labels equal the exhaustive ones"
    assert run_in_process(any_db, _runtime(any_db)) == {}


def test_sibling_trajectories_stand_in_for_rollouts_of_the_prefixes_they_share(any_db: Database) -> None:
    """Several trajectories of a problem, drawn by the policy the rollouts come from: their
    outcomes are samples of the prompt (and of any first chunks they share), so prefix 0
    needs fewer rollouts of its own; the labels keep their accuracy, and relabelling from
    the stored rollouts (which reads the siblings too) decides exactly the same."""
    from stepq.workers.labelling.qvalues import relabel_set

    drawn: dict[str, int] = {}
    for name, budget in (("alone", "adaptive:sib=0"), ("sib", "adaptive")):
        synth_set(any_db, name, problems=20, seed=6, trajectories_per_problem=4, error_rate=0.3, recovery_rate=0.0)
        _annotate(any_db, name, 16, budget=budget)
        run_in_process(any_db, _runtime(any_db))
        with any_db.session() as s:
            drawn[name] = s.scalar(
                select(func.count())
                .select_from(Rollout)
                .join(Trajectory, Trajectory.id == Rollout.trajectory_id)
                .join(Problem, Problem.id == Trajectory.problem_id)
                .join(ProblemSet, ProblemSet.id == Problem.problem_set_id)
                .where(ProblemSet.name == name, Rollout.prefix_len == 0)
            )
    assert drawn["sib"] < drawn["alone"], drawn
    alone, sib = _labels(any_db, "alone"), _labels(any_db, "sib")
    assert sib.keys() == alone.keys()
    truth_alone, truth_sib = label_accuracy(any_db, "alone"), label_accuracy(any_db, "sib")
    assert truth_sib[0] >= truth_alone[0] - 0.03 and truth_sib[1] >= truth_alone[1] - 0.03
    before = _labels(any_db, "sib")
    relabel_set(any_db, "sib", parse_rule("abs-q"))
    assert _labels(any_db, "sib") == before


def test_a_new_rule_on_an_adaptive_set_samples_only_what_it_needs(sqlite: Database) -> None:
    synth_set(sqlite, "a", problems=15, seed=4)
    _annotate(sqlite, "a", 16, budget="adaptive")
    run_in_process(sqlite, _runtime(sqlite))
    with sqlite.session() as s:
        first = {r.id for r in s.scalars(select(Rollout))}
    from stepq.workers.labelling.qvalues import relabel_set

    report = relabel_set(sqlite, "a", parse_rule("rel-ratio"))
    assert report.undecided > 0, "Abs-Q's samples do not settle every Rel-Ratio label"
    _annotate(sqlite, "a", 16, rule="rel-ratio")
    run_in_process(sqlite, _runtime(sqlite))
    with sqlite.session() as s:
        after = {r.id for r in s.scalars(select(Rollout))}
    assert first < after, "kept every earlier rollout and added some"
    labels = _labels(sqlite, "a")
    assert {rule for _, _, _, rule in labels} == {"abs-q", "rel-ratio:gamma=0.8"}
    with sqlite.session() as s:
        row = queries.progress(s)[0]
    assert row["labelled_chunks"] == row["chunks"]


def test_interrupted_adaptive_work_resumes_to_the_same_result(sqlite: Database, tmp_path: object) -> None:
    """A task that dies after some rounds leaves committed rounds; the next one carries on
    and ends with exactly the rollouts and labels of an uninterrupted run (a round is
    committed whole when it fits in one batch, and decisions depend only on committed rounds)."""
    from stepq.migrations import upgrade

    other_url = f"sqlite:///{tmp_path}/other.db"  # type: ignore[str-bytes-safe]
    upgrade(other_url)
    other = Database(other_url)
    for db in (sqlite, other):
        synth_set(db, "r", problems=12, seed=6)
        _annotate(db, "r", 16, budget="adaptive", rule="rel-effective")
    run_in_process(other, _runtime(other))

    class Dies(Exception):
        pass

    calls = {"n": 0}
    real = _runtime(sqlite)
    backend = real.engines.backend_for(queries_set(sqlite, "r"))

    class Flaky:
        name = backend.name
        generator = backend.generator

        def generate(self, requests, params):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            if calls["n"] % 5 == 0:
                raise Dies("worker lost mid-round")
            return backend.generate(requests, params)

        def close(self) -> None:
            pass

    flaky = worker_runtime(
        sqlite,
        WorkerOptions(batch_rollouts=32, name="flaky"),
        backend=Flaky(),
    )
    outcomes = run_in_process(sqlite, flaky, kinds=with_retry(KINDS, RetryPolicy(max_attempts=50, backoff_s=0.01)))
    assert outcomes.get("retry", 0) > 0 and "failed" not in outcomes
    assert _labels(sqlite, "r") == _labels(other, "r")
    with sqlite.session() as s, other.session() as o:
        mine = sorted((r.prefix_len, r.sample_idx, r.reward) for r in s.scalars(select(Rollout)))
        theirs = sorted((r.prefix_len, r.sample_idx, r.reward) for r in o.scalars(select(Rollout)))
    assert mine == theirs


def queries_set(db: Database, name: str):  # type: ignore[no-untyped-def]
    with db.session() as s:
        return queries.get_set(s, name)


def test_rollout_text_can_be_dropped(sqlite: Database) -> None:
    synth_set(sqlite, "t", problems=3, seed=1)
    _annotate(sqlite, "t", 2)
    run_in_process(sqlite, worker_runtime(sqlite, WorkerOptions(name="t", store_text=False)))
    with sqlite.session() as s:
        rows = list(s.scalars(select(Rollout)))
    assert rows and all(r.text == "" and r.final_answer for r in rows)
    assert_exact(sqlite, "t", 2)


def test_several_items_per_task_share_engine_calls(sqlite: Database) -> None:
    """Four trajectories per task: one generate call carries all their batches, and the
    result is the same as one trajectory at a time."""
    synth_set(sqlite, "g", problems=8, seed=2)
    _annotate(sqlite, "g", 4, budget="adaptive", rule="rel-ratio")
    real = _runtime(sqlite)
    backend = real.engines.backend_for(queries_set(sqlite, "g"))
    calls: list[int] = []

    class Counting:
        name = backend.name
        generator = backend.generator

        def generate(self, requests, params):  # type: ignore[no-untyped-def]
            calls.append(len({r.context.split("Solution:")[0] for r in requests}))
            return backend.generate(requests, params)

        def close(self) -> None:
            pass

    rt = worker_runtime(sqlite, WorkerOptions(batch_rollouts=32, name="g"), backend=Counting())
    assert run_in_process(sqlite, rt, items_per_task=4) == {"done": 8}
    assert max(calls) > 1, "one engine call served several trajectories"
    together = _labels(sqlite, "g")
    with sqlite.session() as s:
        rollouts_together = sorted((r.trajectory_id, r.prefix_len, r.sample_idx) for r in s.scalars(select(Rollout)))
    from sqlalchemy import text as sql

    with sqlite.engine.begin() as conn:
        for table in ("chunk_labels", "q_values", "rollouts"):
            conn.execute(sql(f"DELETE FROM {table}"))
    _annotate(sqlite, "g", 4, budget="adaptive", rule="rel-ratio")
    with sqlite.engine.begin() as conn:
        conn.execute(sql("UPDATE rollout_work SET state = 'pending'"))
    assert run_in_process(sqlite, _runtime(sqlite), items_per_task=1) == {"done": 8}
    with sqlite.session() as s:
        alone = sorted((r.trajectory_id, r.prefix_len, r.sample_idx) for r in s.scalars(select(Rollout)))
    assert alone == rollouts_together and _labels(sqlite, "g") == together


@pytest.mark.parametrize("rule", ["abs-q", "rel-ratio"])
def test_adaptive_labels_hold_where_the_policy_recovers(sqlite: Database, rule: str) -> None:
    """Recovery 0.2 and steps of different difficulty: Q is not monotone and a dead prefix
    can come back, so the adaptive budget's shortcuts can fail, and the relative rules' truth
    differs from Abs-Q's.  Its labels must still be about as accurate, against the exact-Q
    truth, as exhaustive M = 16 on the same trajectories (and both far better than chance),
    with at least half the rollouts saved."""
    from sqlalchemy import text

    from stepq.workers.backends.synthetic import SyntheticBackend
    from stepq.workers.data.synthetic_set import exact_labels

    config = {"error_rate": 0.1, "recovery_rate": 0.2, "op_error_rates": {"Add": 0.05, "Multiply by": 0.3}}
    policy = SyntheticBackend.from_config(config).policy
    accuracy, rollouts = {}, {}
    for budget in ("exhaustive", "adaptive"):
        synth_set(sqlite, budget, problems=60, seed=11, **config)  # type: ignore[arg-type]
        _annotate(sqlite, budget, 16, budget=budget, rule=rule)
        run_in_process(sqlite, _runtime(sqlite))
        got = {(k[0], k[2]): v for k, v in _labels(sqlite, budget).items()}  # one trajectory a problem
        with sqlite.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT p.external_id, t.prompt, t.seed FROM trajectories t JOIN problems p ON p.id = t.problem_id"
                    " JOIN problem_sets s ON s.id = p.problem_set_id WHERE s.name = :n"
                ),
                {"n": budget},
            ).all()
            rollouts[budget] = conn.execute(
                text(
                    "SELECT count(*) FROM rollouts r JOIN trajectories t ON t.id = r.trajectory_id"
                    " JOIN problems p ON p.id = t.problem_id JOIN problem_sets s ON s.id = p.problem_set_id"
                    " WHERE s.name = :n"
                ),
                {"n": budget},
            ).scalar_one()
        want = {
            (ext, i): label
            for ext, prompt, seed in rows
            for i, label in enumerate(exact_labels(policy, prompt, seed, parse_rule(rule)), start=1)
        }
        accuracy[budget] = sum(got.get(k) == v for k, v in want.items()) / len(want)
    assert accuracy["exhaustive"] > 0.8
    assert accuracy["adaptive"] >= accuracy["exhaustive"] - 0.03, accuracy
    assert rollouts["adaptive"] * 2 <= rollouts["exhaustive"], rollouts


def test_run_resumes_a_set_with_its_own_settings_and_refuses_to_change_them(tmp_path: Path) -> None:
    """`stepq run --set big`, the obvious resume of a set annotated with M = 16, runs with 16
    (it ran with the default 8: progress past 100% and changed labels); a flag that would
    change the set's M, rule or budget is refused with the command that changes it on purpose."""
    from click.testing import CliRunner

    from stepq.cli import main

    env = {"STEPQ_DATABASE_URL": f"sqlite:///{tmp_path / 's.db'}"}
    runner = CliRunner()
    assert runner.invoke(main, ["synth", "--set", "big", "--problems", "4"], env=env).exit_code == 0
    assert runner.invoke(main, ["annotate", "--set", "big", "--rollouts", "16"], env=env).exit_code == 0
    resumed = runner.invoke(main, ["run", "--set", "big"], env=env)
    assert resumed.exit_code == 0, resumed.output
    # its table reports the run's own rate (it read 0.0: the work ran in process, with no
    # dispatcher's samples to measure it from), done at 100 %
    header = next(line for line in resumed.output.splitlines() if line.startswith("set "))
    (row,) = [line.split() for line in resumed.output.splitlines() if line.startswith("big ")]
    cells = dict(zip(header.split(), row, strict=True))
    assert float(cells["rollouts/s"]) > 0 and cells["%"] == "100.0" and cells["ETA"] == "done", cells
    db = Database(env["STEPQ_DATABASE_URL"])
    with db.session() as s:
        pset = queries.get_set(s, "big")
        assert pset.rollouts_per_prefix == 16 and pset.label_rule == "abs-q"
    with db.engine.connect() as conn:
        per_prefix = {
            n for (n,) in conn.execute(text("SELECT count(*) FROM rollouts GROUP BY trajectory_id, prefix_len"))
        }
    assert per_prefix == {16}
    before = table_counts(db)
    for flags, named in ((["--rollouts", "8"], "M=16"), (["--rule", "rel-ratio:gamma=0.7"], "rule abs-q")):
        refused = runner.invoke(main, ["run", "--set", "big", *flags], env=env)
        assert refused.exit_code == 2 and named in refused.output, refused.output
        assert f"stepq annotate --set big --rollouts {16 if flags[0] != '--rollouts' else 8}" in refused.output
    assert table_counts(db) == before, "a refused run changes nothing"
    same = runner.invoke(main, ["run", "--set", "big", "--rollouts", "16", "--rule", "abs-q"], env=env)
    assert same.exit_code == 0, "flags that repeat the set's own settings are fine"
    db.dispose()
