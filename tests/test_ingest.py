"""Ingestion: the real public files as they are, idempotence, and bad input changing nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from stepq.cli import main
from stepq.models import Chunk, Database, Problem, ProblemSet, Trajectory
from stepq.workers.data.ingest import FieldMap, ingest_file
from tests.helpers import DATA, clean_env, run_stepq, table_counts
from tests.ingest_records import annotated_by_hand, solution_records, write_jsonl


def _cli(db: Database, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env={"STEPQ_DATABASE_URL": db.url})
    return result.exit_code, result.output


MATH500 = DATA / "math500_sample.jsonl"
GSM8K = DATA / "gsm8k_sample.jsonl"
PROCESSBENCH = DATA / "processbench_gsm8k_sample.json"


def test_math500_as_it_is(any_db: Database) -> None:
    report = ingest_file(any_db, MATH500, "math500", FieldMap())
    assert (report.records, report.new_problems) == (40, 40)
    with any_db.session() as s:
        p = s.scalar(select(Problem).where(Problem.external_id == "test/precalculus/807.json"))
        assert p is not None and p.reference_answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
        assert p.meta["subject"] == "Precalculus"
    again = ingest_file(any_db, MATH500, "math500", FieldMap())
    assert again.new_problems == 0


def test_gsm8k_final_answer_after_hashes(any_db: Database) -> None:
    report = ingest_file(any_db, GSM8K, "gsm8k", FieldMap())
    assert report.new_problems == 40
    with any_db.session() as s:
        answers = list(s.scalars(select(Problem.reference_answer)))
    assert "18" in answers and all("####" not in a for a in answers)


def test_grown_file_adds_only_new_records(any_db: Database, tmp_path: Path) -> None:
    lines = GSM8K.read_text().splitlines()
    f = tmp_path / "part.jsonl"
    f.write_text("\n".join(lines[:10]) + "\n")
    assert ingest_file(any_db, f, "g", FieldMap()).new_problems == 10
    f.write_text("\n".join(lines[:15]) + "\n")
    assert ingest_file(any_db, f, "g", FieldMap()).new_problems == 5
    with any_db.session() as s:
        assert len(list(s.scalars(select(Problem.id)))) == 15


def test_ordinary_variations_are_accepted(any_db: Database, tmp_path: Path) -> None:
    f = tmp_path / "v.jsonl"
    body = '{"question": "1+1?", "answer": "2"}\r\n\r\n  \r\n{"question": "2+2?", "answer": 4}\r\n'
    f.write_bytes(b"\xef\xbb\xbf" + body.encode())
    assert ingest_file(any_db, f, "v", FieldMap()).new_problems == 2
    arr = tmp_path / "a.json"
    arr.write_text(json.dumps([{"problem": "3+3?", "answer": "6", "id": 7}], indent=2))
    assert ingest_file(any_db, arr, "v", FieldMap()).new_problems == 1


def test_processbench_steps_become_chunks_as_given(any_db: Database) -> None:
    fields = FieldMap(answer=None, steps="steps", outcome="final_answer_correct", first_error="label")
    raw = json.loads(PROCESSBENCH.read_text())
    report = ingest_file(any_db, PROCESSBENCH, "pb", fields)
    assert (report.records, report.new_trajectories) == (len(raw), len(raw)) == (12, 12)
    first = raw[0]
    with any_db.session() as s:
        p = s.scalar(select(Problem).where(Problem.external_id == first["id"]))
        assert p is not None
        t = s.scalar(select(Trajectory).where(Trajectory.problem_id == p.id))
        assert t is not None and t.outcome == first["final_answer_correct"]
        chunks = list(s.scalars(select(Chunk).where(Chunk.trajectory_id == t.id).order_by(Chunk.idx)))
    assert [c.text.rstrip("\n") for c in chunks] == [st.rstrip("\n") for st in first["steps"]]
    assert "".join(c.text for c in chunks) == t.text
    assert [c.ground_truth for c in chunks] == [i < first["label"] or first["label"] == -1 for i in range(len(chunks))]
    assert ingest_file(any_db, PROCESSBENCH, "pb", fields).new_trajectories == 0
    from stepq.models.errors import ConfigError
    from stepq.workers.annotation_plans import configure_annotation

    with pytest.raises(ConfigError, match="12 problems without a reference answer"):
        configure_annotation(any_db, "pb", 8)


def test_segment_refuses_given_steps_unless_they_are_exported_first(any_db: Database, tmp_path: Path) -> None:
    """A ProcessBench set's steps are the data: re-cutting them dropped 57 given steps and every
    per-step truth label without a word.  Refused; with --export-old the old chunks and their
    truth are written out first, and only then re-cut."""
    from stepq.models.errors import ConfigError
    from stepq.workers.data.policy_sampling import resegment_set

    fields = FieldMap(answer=None, steps="steps", outcome="final_answer_correct", first_error="label")
    raw = {r["id"]: r for r in json.loads(PROCESSBENCH.read_text())}
    ingest_file(any_db, PROCESSBENCH, "pb", fields)

    def chunks() -> dict[str, list[tuple[str, bool | None]]]:
        with any_db.session() as s:
            rows = s.execute(
                select(Problem.external_id, Chunk.text, Chunk.ground_truth)
                .join(Trajectory, Trajectory.problem_id == Problem.id)
                .join(Chunk, Chunk.trajectory_id == Trajectory.id)
                .order_by(Chunk.trajectory_id, Chunk.idx)
            )
            out: dict[str, list[tuple[str, bool | None]]] = {}
            for ext, text_, truth in rows:
                out.setdefault(ext, []).append((text_, truth))
            return out

    before = chunks()
    with pytest.raises(ConfigError, match="12 trajectories hold steps given with the data"):
        resegment_set(any_db, "pb", "blank-lines")
    assert chunks() == before  # nothing was touched
    old = tmp_path / "old.jsonl"
    report = resegment_set(any_db, "pb", "blank-lines", export_old=old)
    assert (report.exported, report.resegmented) == (12, 12)
    exported = {e["external_id"]: e for e in map(json.loads, old.read_text().splitlines())}
    assert set(exported) == set(raw)
    for ext, entry in exported.items():
        assert entry["segmentation"] == "given-steps" and entry["set"] == "pb"
        assert [(c["text"], c["ground_truth"]) for c in entry["chunks"]] == before[ext]
        label = raw[ext]["label"]
        assert [c["ground_truth"] for c in entry["chunks"]] == [
            label == -1 or i < label for i in range(len(entry["chunks"]))
        ]
    assert all(truth is None for cs in chunks().values() for _, truth in cs)  # the new cut has no truth
    with pytest.raises(ConfigError, match="never overwrites"):
        resegment_set(any_db, "pb", "blank-lines", export_old=old)


def test_the_same_steps_from_another_file_are_the_same_trajectory(any_db: Database, tmp_path: Path) -> None:
    """A renamed or merged copy of a file adds no second trajectory (no rollouts paid twice);
    other steps for the same problem are another trajectory."""
    fields = FieldMap(answer=None, steps="steps", outcome="final_answer_correct", first_error="label")
    raw = json.loads(PROCESSBENCH.read_text())
    assert ingest_file(any_db, PROCESSBENCH, "pb", fields).new_trajectories == 12
    copy = tmp_path / "renamed.json"
    copy.write_text(json.dumps([*raw[:5], raw[5], raw[5]]))  # a record twice in one file, too
    assert ingest_file(any_db, copy, "pb", fields).new_trajectories == 0
    other = [{**raw[0], "steps": [*raw[0]["steps"][:-1], "A different last step."]}]
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert ingest_file(any_db, tmp_path / "other.json", "pb", fields).new_trajectories == 1
    with any_db.session() as s:
        assert len(list(s.scalars(select(Trajectory.id)))) == 13


BAD_INPUTS = [
    (
        "invalid-json.jsonl",
        b'{"question": "a", "answer": "1"}\n{"question": "b", "answer": \n',
        2,
        None,
        "invalid JSON",
    ),
    (
        "missing-question.jsonl",
        b'{"question": "a", "answer": "1"}\n\n{"answer": "2"}\n',
        3,
        "question",
        "missing question",
    ),
    (
        "empty-answer.jsonl",
        b'{"question": "a", "answer": "1"}\n{"question": "b", "answer": "  "}\n',
        2,
        "answer",
        "answer is empty",
    ),
    ("wrong-type.jsonl", b'{"question": ["a"], "answer": "1"}\n', 1, "question", "must be a string"),
    ("not-object.jsonl", b'{"question": "a", "answer": "1"}\n[1, 2]\n', 2, None, "must be a JSON object"),
    ("empty.jsonl", b"\n \n", None, None, "file is empty"),
    (
        "bad-bytes.jsonl",
        b'{"question": "a", "answer": "1"}\n{"question": "b\xff", "answer": "2"}\n',
        2,
        None,
        "not valid UTF-8",
    ),
    (
        "bad-array.json",
        b'[\n  {"question": "a", "answer": "1"},\n  {"question": "b", "answer": null}\n]\n',
        3,
        "answer",
        "missing answer",
    ),
    ("truncated-array.json", b'[\n  {"question": "a", "answer": "1"},\n  {"question": "b"', 3, None, "invalid JSON"),
    (
        "duplicate-id.jsonl",
        b'{"id": 1, "question": "a", "answer": "1"}\n{"id": 1, "question": "b", "answer": "2"}\n',
        2,
        "id",
        "id '1' already used on line 1",
    ),
    ("gsm8k-no-final.jsonl", b'{"question": "a", "answer": "work\\n#### "}\n', 1, "answer", "no final answer"),
    # what a database cannot store as given: each an error naming the line, never an internal error
    (
        "nan.jsonl",
        b'{"question": "a", "answer": "1"}\n{"question": "b", "answer": "2", "score": NaN}\n',
        2,
        None,
        "NaN",
    ),
    ("huge-float.jsonl", b'{"question": "a", "answer": "1", "score": 1e400}\n', 1, "score", "inf is not a number"),
    ("nul.jsonl", b'{"question": "a\\u0000b", "answer": "1"}\n', 1, "question", "NUL character"),
    ("surrogate.jsonl", b'{"question": "a", "answer": "1", "note": "x\\ud800y"}\n', 1, "note", "lone surrogate"),
    ("deep.jsonl", b'{"question": "a", "answer": "1", "x": ' + b"[" * 40 + b"]" * 40 + b"}\n", 1, "x", "nested deeper"),
    (
        "deeper.jsonl",
        b'{"question": "a", "answer": "1", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
        1,
        None,
        "invalid JSON",
    ),
    ("long-id.jsonl", b'{"id": "' + b"x" * 201 + b'", "question": "a", "answer": "1"}\n', 1, "id", "longer than 200"),
    ("long-int.jsonl", b'{"question": "a", "answer": "1", "n": ' + b"7" * 5000 + b"}\n", 1, None, "invalid JSON"),
    (
        "nan-array.json",
        b'[\n  {"question": "a", "answer": "1"},\n  {"question": "b", "answer": Infinity}\n]\n',
        3,
        None,
        "Infinity",
    ),
]


@pytest.mark.parametrize(("name", "content", "line", "field", "reason"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_rejected_and_changes_nothing(
    any_db: Database, tmp_path: Path, name: str, content: bytes, line: int | None, field: str | None, reason: str
) -> None:
    ingest_file(any_db, MATH500, "keep", FieldMap())
    before = table_counts(any_db)
    bad = tmp_path / name
    bad.write_bytes(content)
    code, output = _cli(any_db, "ingest", str(bad), "--set", "new-set")
    assert code == 3, output
    where = f"{bad}:{line}" if line else str(bad)
    assert where in output and reason in output
    if field:
        assert f"field '{field}'" in output
    assert "Traceback" not in output
    assert table_counts(any_db) == before


def test_cli_exit_code_and_message_in_a_real_process(sqlite: Database, tmp_path: Path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"question": "q"}\n')
    env = {"STEPQ_DATABASE_URL": sqlite.url, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "stepq", "ingest", str(bad), "--set", "s"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3
    assert proc.stderr.strip() == f"stepq: error: {bad}:1: field 'answer': missing answer"


def test_missing_file_is_a_clear_error(sqlite: Database, tmp_path: Path) -> None:
    code, output = _cli(sqlite, "ingest", str(tmp_path / "nope.jsonl"), "--set", "s")
    assert code == 3 and "cannot read file" in output


def test_reingesting_changed_content_is_an_error_naming_the_line(any_db: Database, tmp_path: Path) -> None:
    ingest_file(any_db, write_jsonl(tmp_path / "v1.jsonl", solution_records()), "u", FieldMap(steps="steps"))
    before = table_counts(any_db)
    code, out = _cli(
        any_db,
        "ingest",
        str(write_jsonl(tmp_path / "v2.jsonl", solution_records(answer="6"))),
        "--set",
        "u",
        "--steps",
        "steps",
    )
    assert code == 3, out
    assert "v2.jsonl:1" in out and "answer" in out and "--update" in out
    assert table_counts(any_db) == before, "nothing changed"


def test_update_with_a_new_answer_regrades_and_reopens(any_db: Database, tmp_path: Path) -> None:
    from stepq.models import RolloutWork
    from stepq.models.rollouts import QValue, Rollout

    ingest_file(any_db, write_jsonl(tmp_path / "v1.jsonl", solution_records()), "u", FieldMap(steps="steps"))
    tid = annotated_by_hand(any_db)
    report = ingest_file(
        any_db,
        write_jsonl(tmp_path / "v2.jsonl", solution_records(answer="6")),
        "u",
        FieldMap(steps="steps"),
        update=True,
    )
    assert report.updated_problems == 1
    with any_db.session() as s:
        assert s.scalar(select(Problem.reference_answer).where(Problem.external_id == "a")) == "6"
        assert set(s.scalars(select(Rollout.reward).where(Rollout.trajectory_id == tid))) == {0}, "re-graded"
        traj = s.get(Trajectory, tid)
        assert traj is not None and traj.outcome is False
        assert set(s.scalars(select(QValue.q).where(QValue.trajectory_id == tid))) == {0.0}
        assert s.scalar(select(RolloutWork.state).where(RolloutWork.trajectory_id == tid)) == "pending"


def test_update_with_a_new_question_drops_what_was_sampled_for_the_old(any_db: Database, tmp_path: Path) -> None:
    from stepq.models.rollouts import Rollout

    ingest_file(any_db, write_jsonl(tmp_path / "v1.jsonl", solution_records()), "u", FieldMap(steps="steps"))
    annotated_by_hand(any_db)
    ingest_file(
        any_db,
        write_jsonl(tmp_path / "v1.jsonl", solution_records(question="What is 3 + 2?")),  # the same file, edited
        "u",
        FieldMap(steps="steps"),
        update=True,
    )
    with any_db.session() as s:
        assert s.scalar(select(Problem.question).where(Problem.external_id == "a")) == "What is 3 + 2?"
        assert list(s.scalars(select(Rollout.id))) == []
        prompts = list(s.scalars(select(Trajectory.prompt)))
    assert len(prompts) == 2 and any("What is 3 + 2?" in p for p in prompts), "the file's steps came back"


def test_a_hugging_face_dataset_ingests_as_its_file_does(sqlite: Database, tmp_path: Path) -> None:
    """`stepq ingest --hf`: a dataset saved with save_to_disk and a folder of data files read
    by datasets.load_dataset give the same problems as the JSONL they were made from; a bad
    row is an error naming its row and field, and nothing of it is written."""
    import datasets

    rows = [json.loads(line) for line in MATH500.read_text().splitlines()]
    saved = tmp_path / "saved"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(saved))
    files = tmp_path / "files"
    files.mkdir()
    (files / "test.jsonl").write_text(MATH500.read_text())
    code, out = _cli(sqlite, "ingest", str(saved), "--hf", "--set", "saved")
    assert code == 0 and "40 records, 40 new problems" in out, out
    code, out = _cli(sqlite, "ingest", str(files), "--hf", "--split", "test", "--set", "files")
    assert code == 0 and "40 new problems" in out, out
    ingest_file(sqlite, MATH500, "jsonl", FieldMap())
    with sqlite.session() as s:
        names = {pset.id: pset.name for pset in s.scalars(select(ProblemSet))}
        by_set: dict[str, set[tuple[str, str, str]]] = {}
        for p in s.scalars(select(Problem)):
            by_set.setdefault(names[p.problem_set_id], set()).add((p.external_id, p.question, p.reference_answer))
    assert len(by_set["jsonl"]) == 40
    assert by_set["saved"] == by_set["files"] == by_set["jsonl"], "the same records as the JSONL file"
    broken = tmp_path / "broken"
    datasets.Dataset.from_list([rows[0], {**rows[1], "answer": ""}]).save_to_disk(str(broken))
    before = table_counts(sqlite)
    code, out = _cli(sqlite, "ingest", str(broken), "--hf", "--set", "broken")
    assert code == 3 and f"{broken}:2: field 'answer'" in out, out
    assert table_counts(sqlite) == before
    code, out = _cli(sqlite, "ingest", str(saved), "--hf", "--split", "train", "--set", "x")
    assert code == 3 and "no split 'train': it has test (choose one with --split)" in out, out


def test_ingest_reads_what_people_have(sqlite: Database, tmp_path: Path) -> None:
    """A folder of train-*.parquet files (its only split), a Parquet or JSONL file given to
    --hf (read as a file, not looked up on the hub), a .parquet file without --hf (read as
    Parquet, not as text); several splits are listed, not guessed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in MATH500.read_text().splitlines()]
    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:20]), shards / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(rows[20:]), shards / "train-00001-of-00002.parquet")
    code, out = _cli(sqlite, "ingest", str(shards), "--hf", "--set", "shards")
    assert code == 0 and "40 new problems" in out and f"{shards}[train]" not in out, out
    single = tmp_path / "math.parquet"
    pq.write_table(pa.Table.from_pylist(rows), single)
    code, out = _cli(sqlite, "ingest", str(single), "--set", "parquet")
    assert code == 0 and "40 records, 40 new problems" in out, out
    code, out = _cli(sqlite, "ingest", str(single), "--hf", "--set", "parquet-hf")
    assert code == 0 and "40 new problems" in out, out
    code, out = _cli(sqlite, "ingest", str(MATH500), "--hf", "--set", "jsonl-hf")
    assert code == 0 and "40 new problems" in out, out
    pq.write_table(pa.Table.from_pylist(rows[:5]), shards / "test-00000-of-00001.parquet")
    code, out = _cli(sqlite, "ingest", str(shards), "--hf", "--set", "two")
    assert code == 3 and "several splits: it has test, train (choose one with --split)" in out, out
    with sqlite.session() as s:
        sizes = {
            name: s.scalar(select(func.count(Problem.id)).join(ProblemSet).where(ProblemSet.name == name))
            for name in ("shards", "parquet", "parquet-hf", "jsonl-hf")
        }
    assert sizes == dict.fromkeys(sizes, 40)


def test_an_unreachable_hub_is_its_own_error_at_once_offline(tmp_path: Path) -> None:
    """A hub id that cannot be fetched (offline here) is exit 66 naming the cause, not an
    internal error after 25 s of retries; a local path is never sent to the hub."""
    import time

    env = clean_env(STEPQ_DATABASE_URL=f"sqlite:///{tmp_path / 'stepq.db'}", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path))
    started = time.monotonic()
    proc = run_stepq("ingest", "nobody/no-such-dataset", "--hf", "--set", "x", env=env, cwd=tmp_path)
    assert proc.returncode == 66, proc.stderr
    assert "the Hugging Face hub cannot be reached (HF_HUB_OFFLINE is set" in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr and time.monotonic() - started < 20


def test_a_first_error_past_the_last_step_is_refused_not_stored_as_no_error(any_db: Database, tmp_path: Path) -> None:
    from stepq.models.errors import InputError

    records = solution_records()
    records[1]["label"] = 99  # two steps: 0 or 1 are steps, -1 is none
    records[0]["label"] = 1
    path = write_jsonl(tmp_path / "pb.jsonl", records)
    before = table_counts(any_db)
    fields = FieldMap(steps="steps", first_error="label")
    with pytest.raises(InputError, match=r"pb.jsonl:2: field 'label': 99 is past the last of the 2 steps"):
        ingest_file(any_db, path, "pb", fields)
    assert table_counts(any_db) == before
