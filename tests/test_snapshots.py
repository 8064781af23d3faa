"""Snapshots: exact 50/50 per split, split by problem, reproducible, immutable, exportable."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from sqlalchemy import select, text

from stepq.assembly import worker_runtime
from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.models.problems import Problem
from stepq.models.trajectories import Trajectory
from stepq.trainer.snapshots.balance import LabelledChunk, balance, plan_snapshot, validation_problems
from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
from stepq.trainer.snapshots.export import export_snapshot
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.labelling.labels import parse_rule
from tests.helpers import annotated_set


def _rows(n: int, seed: int, p_pos: float = 0.7, problems: int = 30) -> list[LabelledChunk]:
    rng = random.Random(seed)
    return [
        LabelledChunk(i, i // 3, rng.randrange(problems), i % 3 + 1, rng.random() < p_pos, rng.random(), rng.random())
        for i in range(n)
    ]


@pytest.mark.parametrize("seed", range(20))
def test_plan_is_balanced_per_split_and_splits_by_problem(seed: int) -> None:
    rows = _rows(400, seed, p_pos=random.Random(seed).uniform(0.2, 0.9))
    plan = plan_snapshot(rows, 0.25, seed, balanced=True)
    for part in plan.splits.values():
        pos = sum(r.positive for r in part)
        assert pos * 2 == len(part)
    train_problems = {r.problem_id for r in plan.splits["train"]}
    val_problems = {r.problem_id for r in plan.splits["validation"]}
    assert not train_problems & val_problems
    # nothing is invented: every kept row is an input row
    assert set(plan.splits["train"]) | set(plan.splits["validation"]) <= set(rows)
    # down-sampling keeps the whole minority class of each split
    for name in plan.splits:
        assert plan.counts_after[name]["positive"] == min(plan.counts_before[name].values())


def test_unbalanced_plan_keeps_every_row() -> None:
    rows = _rows(100, 3)
    plan = plan_snapshot(rows, 0.2, 3, balanced=False)
    assert sorted(plan.splits["train"] + plan.splits["validation"]) == sorted(rows)


def test_balancing_by_position_leaves_no_cue_in_the_step_index() -> None:
    """Positives early, negatives late (Abs-Q's shape): overall balance keeps the cue, balancing
    by position keeps exactly min(positives, negatives) of each class at every index."""
    counts = {1: (10, 2), 2: (5, 5), 3: (1, 8)}  # index: (positives, negatives)
    rows, i = [], 0
    for idx, (pos, neg) in counts.items():
        for positive in [True] * pos + [False] * neg:
            rows.append(LabelledChunk(i, i, i, idx, positive, 0.5, 0.5))
            i += 1
    overall = balance(rows, 0)
    late = [r.positive for r in overall if r.chunk_idx == 3]
    assert len(overall) == 30 and late.count(False) == 8 and late.count(True) <= 1, "the cue stays"
    by_position = balance(rows, 0, by_position=True)
    kept = {idx: [r.positive for r in by_position if r.chunk_idx == idx] for idx in counts}
    assert {idx: (sum(v), len(v) - sum(v)) for idx, v in kept.items()} == {1: (2, 2), 2: (5, 5), 3: (1, 1)}
    assert balance(rows, 0, by_position=True) == by_position, "seeded"


def test_a_snapshot_balanced_by_position_says_so(sqlite: Database) -> None:
    annotated_set(sqlite, problems=40, error_rate=0.25, recovery_rate=0.0)
    with pytest.raises(ConfigError, match="needs balancing"):
        create_snapshot(sqlite, SnapshotSpec(("s",), "abs-q", balanced=False, balance_by_position=True))
    number = create_snapshot(sqlite, SnapshotSpec(("s",), "abs-q", 0.25, balance_by_position=True))
    with sqlite.session() as s:
        manifest = queries.get_snapshot(s, number).manifest
        rows = s.execute(
            text("SELECT split, chunk_idx, positive FROM snapshot_rows WHERE snapshot_id = :n"), {"n": number}
        ).all()
    assert manifest["balance"].startswith("by position")
    tally: dict[tuple[str, int], list[int]] = {}
    for split, idx, positive in rows:
        tally.setdefault((split, idx), [0, 0])[bool(positive)] += 1
    assert len(tally) >= 4 and all(neg == pos for neg, pos in tally.values()), tally


def test_the_commands_take_balance_by_position(sqlite: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from stepq.cli import main

    annotated_set(sqlite, problems=20, error_rate=0.25, recovery_rate=0.0)
    monkeypatch.setenv("STEPQ_DATABASE_URL", sqlite.url)
    runner = CliRunner()
    done = runner.invoke(main, ["snapshot", "create", "--sets", "s", "--rule", "abs-q", "--balance-by-position"])
    assert done.exit_code == 0, done.output
    assert json.loads(runner.invoke(main, ["snapshot", "show", "1"]).output)["balance"].startswith("by position")
    refused = runner.invoke(
        main, ["snapshot", "create", "--sets", "s", "--rule", "abs-q", "--no-balance", "--balance-by-position"]
    )
    assert refused.exit_code != 0 and "needs balancing" in refused.output
    assert "--balance-by-position" in runner.invoke(main, ["trainer", "serve", "--help"]).output


def test_balance_of_one_class_is_empty_and_split_fraction_is_by_problem() -> None:
    only_pos = [r for r in _rows(50, 1) if r.positive]
    assert balance(only_pos, 0) == []
    assert 900 <= len(validation_problems(range(10_000), 0.1, 7)) <= 1100
    assert validation_problems(range(100), 0.1, 7) == validation_problems(range(100), 0.1, 7)
    assert validation_problems(range(100), 0.1, 7) != validation_problems(range(100), 0.1, 8)
    assert validation_problems(range(10), 0.0, 1) == set()


def test_a_problem_keeps_its_side_as_the_set_grows() -> None:
    """The side is the problem's own: a bigger set puts every earlier problem where it was."""
    small, large = validation_problems(range(50), 0.2, 3), validation_problems(range(500), 0.2, 3)
    assert small and small == large & set(range(50))
    assert validation_problems([7, 40, 3], 0.2, 3) == large & {7, 40, 3}


def test_splits_stay_put_across_a_lineage_as_the_set_grows(pg: Database) -> None:
    sides: dict[int, set[str]] = {}
    for number, problems in enumerate((20, 35, 50), 1):
        annotated_set(
            pg, problems=problems, error_rate=0.25, recovery_rate=0.0
        )  # the same set, grown: only the new problems are annotated
        ref = create_snapshot(pg, SnapshotSpec(("s",), "abs-q", 0.25, 0, name=f"L-{number}", lineage="L"))
        with pg.session() as s:
            rows = queries.snapshot_rows(s, ref)
        assert len({r.problem_id for r in rows}) > (problems * 3) // 4  # the grown set is in it
        for r in rows:
            sides.setdefault(r.problem_id, set()).add(r.split)
    assert all(len(split) == 1 for split in sides.values()), "a problem changed sides between snapshots"
    assert any(split == {"validation"} for split in sides.values())


def _snapshot_rows(db: Database, ref: int) -> list[tuple]:
    with db.session() as s:
        return [(r.split, r.chunk_id, r.positive, r.q_before, r.q_after) for r in queries.snapshot_rows(s, ref)]


def test_snapshot_on_postgres_is_balanced_reproducible_and_immutable(pg: Database, tmp_path: Path) -> None:
    annotated_set(pg, error_rate=0.25, recovery_rate=0.0)
    first = create_snapshot(pg, SnapshotSpec(("s",), "abs-q", val_fraction=0.25, seed=5))
    again = create_snapshot(pg, SnapshotSpec(("s",), "abs-q", val_fraction=0.25, seed=5, name="same-seed"))
    other = create_snapshot(pg, SnapshotSpec(("s",), "abs-q", val_fraction=0.25, seed=6, name="other-seed"))
    with pg.session() as s:
        a, b, c = (queries.get_snapshot(s, n) for n in (first, again, other))
        summary = {r["snapshot"]: r for r in queries.snapshot_summaries(s)}
        assert a.content_hash == b.content_hash != c.content_hash
        manifest = a.manifest
    assert _snapshot_rows(pg, first) == _snapshot_rows(pg, again)
    row = summary[first]
    assert row["train_positive"] == row["train_negative"] > 0
    assert row["validation_positive"] == row["validation_negative"] > 0
    assert manifest["counts"]["train"]["positive"] == row["train_positive"]
    assert manifest["rollouts_behind_labels"] > 0 and manifest["rule"] == "abs-q"
    assert set(manifest["counts_before_balancing"]) == {"train", "validation"}
    with pg.session() as s:
        rows = queries.snapshot_rows(s, first)
    train_p = {r.problem_id for r in rows if r.split == "train"}
    val_p = {r.problem_id for r in rows if r.split == "validation"}
    assert train_p and val_p and not train_p & val_p

    before = _snapshot_rows(pg, first)
    # more annotation (raise M: labels and Q-values change) and a relabel under another rule
    configure_annotation(pg, "s", 16)
    run_in_process(pg, worker_runtime(pg, WorkerOptions(batch_rollouts=64, name="more")))
    annotated_set(
        pg, "s", m=16, problems=60, seed=1, error_rate=0.25, recovery_rate=0.0, worker="more2", batch_rollouts=64
    )
    from stepq.workers.labelling.qvalues import relabel_set

    relabel_set(pg, "s", parse_rule("rel-ratio:gamma=0.8"))
    relabel_set(pg, "s", parse_rule("abs-q"))
    assert _snapshot_rows(pg, first) == before
    with pg.session() as s:
        assert queries.get_snapshot(s, first).content_hash == a.content_hash
    # ...while a new snapshot of the same spec now differs: the labels really changed
    later = create_snapshot(pg, SnapshotSpec(("s",), "abs-q", val_fraction=0.25, seed=5, name="later"))
    assert _snapshot_rows(pg, later) != before


def test_snapshot_errors_change_nothing(sqlite: Database) -> None:
    synth_set(sqlite, "raw", problems=5, seed=1)
    with pytest.raises(ConfigError, match="labelled"):
        create_snapshot(sqlite, SnapshotSpec(("raw",), "abs-q"))
    with pytest.raises(Exception, match="no problem set"):
        create_snapshot(sqlite, SnapshotSpec(("missing",), "abs-q"))
    with sqlite.session() as s:
        assert queries.snapshot_summaries(s) == []


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_export_loads_with_datasets_and_carries_the_judge_prompt(sqlite: Database, tmp_path: Path, fmt: str) -> None:
    import datasets

    annotated_set(sqlite, problems=25, error_rate=0.25, recovery_rate=0.0)
    ref = create_snapshot(sqlite, SnapshotSpec(("s",), "abs-q", val_fraction=0.2, seed=0))
    counts = export_snapshot(sqlite, ref, tmp_path / "out", fmt)
    loaded = datasets.load_dataset(str(tmp_path / "out"))
    assert {k: len(v) for k, v in loaded.items()} == counts
    train = loaded["train"]
    assert sorted(set(train["label"])) == ["Negative", "Positive"]
    assert train["label"].count("Positive") == train["label"].count("Negative")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["train"]["positive"] == train["label"].count("Positive")
    with sqlite.engine.connect() as conn:
        chunks = {
            cid: (tid, idx, body, question)
            for cid, tid, idx, body, question in conn.execute(
                text(
                    "SELECT c.id, c.trajectory_id, c.idx, c.text, p.question FROM chunks c "
                    "JOIN trajectories t ON t.id = c.trajectory_id JOIN problems p ON p.id = t.problem_id"
                )
            )
        }
        labels = dict(conn.execute(text("SELECT chunk_id, positive FROM chunk_labels WHERE rule = 'abs-q'")).all())
    by_position = {(tid, idx): body for tid, idx, body, _ in chunks.values()}
    for row in train:
        # each exported row is its own chunk's text, history, question and label in the database
        tid, idx, body, question = chunks[row["chunk_id"]]
        assert (row["trajectory_id"], row["chunk_index"], row["chunk"], row["problem"]) == (tid, idx, body, question)
        assert row["history"] == [by_position[(tid, k)] for k in range(1, idx)]
        assert row["label"] == ("Positive" if labels[row["chunk_id"]] else "Negative")
        assert {"problem_id", "q_before", "q_after"} <= set(row)
    assert any(r["chunk_index"] > 1 for r in train)


def test_a_snapshot_keeps_its_text_through_an_ingest_update(any_db: Database, tmp_path: Path) -> None:
    """A question updated after a snapshot (``stepq ingest --update``) changes the problem, and
    drops what was sampled for the old question, but not what the snapshot exports."""
    from click.testing import CliRunner

    from stepq.cli import main
    from stepq.workers.data.ingest import FieldMap, ingest_file
    from stepq.workers.grading.grader import Grader
    from stepq.workers.labelling.regrade import regrade_trajectories
    from tests.ingest_records import annotated_by_hand as _annotated_by_hand
    from tests.ingest_records import solution_records as _records
    from tests.ingest_records import write_jsonl as _write

    source = _write(tmp_path / "v1.jsonl", _records())
    ingest_file(any_db, source, "u", FieldMap(steps="steps"))
    tid = _annotated_by_hand(any_db)
    regrade_trajectories(any_db, "u", [tid], Grader())  # Q-values and labels from the rollouts
    ref = create_snapshot(any_db, SnapshotSpec(("u",), "abs-q", val_fraction=0.0, balanced=False))
    export_snapshot(any_db, ref, tmp_path / "before", "jsonl")
    before = (tmp_path / "before" / "train.jsonl").read_text()
    assert "What is 2 + 3?" in before and "2 + 3 = 5." in before

    _write(source, _records(question="What is 3 + 2?"))  # the same file, edited
    result = CliRunner().invoke(
        main,
        ["ingest", str(source), "--set", "u", "--steps", "steps", "--update"],
        env={"STEPQ_DATABASE_URL": any_db.url},
    )
    assert result.exit_code == 0, result.output
    with any_db.session() as s:
        assert {p.question for p in s.scalars(select(Problem))} == {"What is 3 + 2?", "What is 1 + 1?"}
        assert s.get(Trajectory, tid) is None  # sampled for the old question: dropped
    export_snapshot(any_db, ref, tmp_path / "after", "jsonl")
    assert (tmp_path / "after" / "train.jsonl").read_text() == before


def test_the_same_set_splits_the_same_way_in_two_databases(tmp_path: Path) -> None:
    """The split hashes what identifies a problem (its external id), not a row id: a database
    that holds another set first (so every row id differs) puts the same problems on the same
    side.  By row id (``split_by='row-id'``, the legacy key a lineage that began with it keeps)
    the two databases disagree."""
    from stepq.migrations import upgrade

    sides: dict[tuple[str, str], set[str]] = {}
    for name, other_first in (("a", False), ("b", True)):
        url = f"sqlite:///{tmp_path / f'{name}.db'}"
        upgrade(url)
        db = Database(url)
        if other_first:
            synth_set(db, "other", problems=37, seed=9)
        annotated_set(db, problems=60, error_rate=0.25, recovery_rate=0.0)
        for split_by in ("external-id", "row-id"):
            ref = create_snapshot(
                db, SnapshotSpec(("s",), "abs-q", 0.3, 5, balanced=False, name=split_by, split_by=split_by)
            )
            with db.session() as s:
                snap = queries.get_snapshot(s, ref)
                assert snap.manifest["split_by"] == split_by
                validation = {
                    ext
                    for (ext,) in s.execute(
                        text(
                            "SELECT DISTINCT p.external_id FROM snapshot_rows r JOIN problems p ON p.id = r.problem_id "
                            "WHERE r.snapshot_id = :i AND r.split = 'validation'"
                        ),
                        {"i": snap.id},
                    )
                }
            sides[(name, split_by)] = validation
        db.dispose()
    assert sides[("a", "external-id")] and sides[("a", "external-id")] == sides[("b", "external-id")]
    assert sides[("a", "row-id")] != sides[("b", "row-id")], "row ids differ between the databases"
    with pytest.raises(ConfigError, match="split_by must be one of"):
        create_snapshot(Database(f"sqlite:///{tmp_path / 'a.db'}"), SnapshotSpec(("s",), "abs-q", split_by="hash"))


def test_a_validation_split_too_small_to_weigh_a_judge_says_so() -> None:
    from stepq.trainer.snapshots.create import validation_note

    tour = validation_note({"train": {"positive": 40, "negative": 40}, "validation": {"positive": 2, "negative": 2}})
    assert tour is not None and "4 rows, too few" in tour and "±49 points" in tour
    assert "nothing to score" in (validation_note({"validation": {"positive": 0, "negative": 0}}) or "")
    assert validation_note({"validation": {"positive": 60, "negative": 60}}) is None
