"""Ingest problems (and optionally given trajectories) from JSONL or JSON-array files.

The whole file is read and validated before anything is written, and then written in
one transaction: a malformed file is rejected with its file:line and field and nothing
of it lands.  Records are keyed by their id field or, lacking one, by a hash of their
content, so re-ingesting a file adds nothing and a grown file adds only its new records.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import InputError
from stepq.models.problems import Problem
from stepq.models.trajectories import GIVEN_STEPS
from stepq.workers.data.record_files import read_records
from stepq.workers.data.segmentation import join_steps
from stepq.workers.grading.grader import Grader, extract_boxed

QUESTION_FIELDS = ("problem", "question", "prompt")
ID_FIELDS = ("unique_id", "id", "idx")
GENERIC_PROMPT = (
    "Solve the problem step by step and give the final answer as \\boxed{{...}}.\n\nProblem: {question}\n\nSolution:\n"
)


@dataclass(frozen=True)
class FieldMap:
    """Which record fields hold what; None means auto-detect (or absent, for steps)."""

    question: str | None = None
    answer: str | None = "answer"
    id: str | None = None
    steps: str | None = None
    outcome: str | None = None
    first_error: str | None = None
    answer_format: str = "auto"  # auto | plain | gsm8k


@dataclass(frozen=True)
class Record:
    line: int
    external_id: str
    question: str
    answer: str
    meta: dict[str, Any]
    steps: tuple[str, ...] | None
    outcome: bool | None
    first_error: int | None


@dataclass(frozen=True)
class IngestReport:
    records: int
    new_problems: int
    new_trajectories: int
    updated_problems: int = 0


MAX_DEPTH = 32
"""Records nest no deeper than this (a step list in a dict is 2)."""
MAX_ID = 200
"""The longest external id a problem can have (its column's width)."""


def _check_values(path: Path | str, line: int, record: dict[str, Any]) -> None:
    """Refuse values no database stores as given, naming the field: non-finite numbers (1e400
    reads as infinity), NUL characters and lone surrogates in text, and deep nesting."""

    def walk(value: Any, field: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise InputError(str(path), line, field, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(str(path), line, field, f"{value} is not a number a database can store")
        if isinstance(value, str):
            if "\x00" in value:
                raise InputError(str(path), line, field, "text holds a NUL character")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InputError(str(path), line, field, "text holds a lone surrogate (not valid Unicode)") from None
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(key, field, depth + 1)
                walk(item, field, depth + 1)
        elif isinstance(value, list):
            for item in value:
                walk(item, field, depth + 1)

    for key, value in record.items():
        walk(key, str(key)[:40], 1)
        walk(value, str(key)[:40], 1)


def _pick(record: dict[str, Any], given: str | None, candidates: Sequence[str]) -> str | None:
    if given is not None:
        return given
    return next((c for c in candidates if c in record), None)


def _text_field(path: Path | str, line: int, record: dict[str, Any], name: str | None, what: str) -> str:
    if name is None or name not in record or record[name] is None:
        raise InputError(str(path), line, name or what, f"missing {what}")
    value = record[name]
    if what == "answer" and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise InputError(str(path), line, name, f"{what} must be a string, not {type(value).__name__}")
    if not value.strip():
        raise InputError(str(path), line, name, f"{what} is empty")
    return value


def _final_answer(answer: str, fmt: str) -> str:
    if fmt == "gsm8k" or (fmt == "auto" and "####" in answer):
        return answer.rsplit("####", 1)[1].strip()
    return answer.strip()


def parse_records(path: Path | str, fields: FieldMap, objects: list[tuple[int, Any]] | None = None) -> list[Record]:
    """Validate every record of the file (or of ``objects`` read elsewhere, e.g. a dataset's
    rows, numbered from 1); raises InputError on the first bad one."""
    records: list[Record] = []
    seen: dict[str, Record] = {}
    for line, obj in read_records(Path(path)) if objects is None else objects:
        if not isinstance(obj, dict):
            raise InputError(str(path), line, None, f"record must be a JSON object, not {type(obj).__name__}")
        _check_values(path, line, obj)
        question = _text_field(path, line, obj, _pick(obj, fields.question, QUESTION_FIELDS), "question")
        answer = (
            ""
            if fields.answer is None
            else _final_answer(_text_field(path, line, obj, fields.answer, "answer"), fields.answer_format)
        )
        if fields.answer is not None and not answer:
            raise InputError(str(path), line, fields.answer, "no final answer after '####'")
        steps = None
        if fields.steps is not None:
            raw = obj.get(fields.steps)
            if not isinstance(raw, list) or not raw or not all(isinstance(s, str) and s for s in raw):
                raise InputError(str(path), line, fields.steps, "steps must be a non-empty list of non-empty strings")
            steps = tuple(raw)
        outcome = None
        if fields.outcome is not None:
            value = obj.get(fields.outcome)
            if not isinstance(value, bool):
                raise InputError(str(path), line, fields.outcome, "outcome must be true or false")
            outcome = value
        first_error = None
        if fields.first_error is not None:
            value = obj.get(fields.first_error)
            if not isinstance(value, int) or isinstance(value, bool) or value < -1:
                raise InputError(str(path), line, fields.first_error, "must be an integer >= -1")
            if steps is not None and value >= len(steps):  # past the last step reads as "no error" otherwise
                raise InputError(
                    str(path), line, fields.first_error, f"{value} is past the last of the {len(steps)} steps (0-based)"
                )
            first_error = value
        id_field = _pick(obj, fields.id, ID_FIELDS)
        if id_field is not None and id_field in obj:
            ext = obj[id_field]
            if not isinstance(ext, (str, int)) or isinstance(ext, bool) or str(ext) == "":
                raise InputError(str(path), line, id_field, "id must be a non-empty string or integer")
            ext = str(ext)
            if len(ext) > MAX_ID:
                raise InputError(str(path), line, id_field, f"id is longer than {MAX_ID} characters")
        else:
            ext = hashlib.sha256(f"{question}\x00{answer}".encode()).hexdigest()[:24]
        meta = {k: v for k, v in obj.items() if isinstance(v, (str, int, float, bool)) and k != id_field}
        rec = Record(line, ext, question, answer, meta, steps, outcome, first_error)
        prior = seen.get(ext)
        if prior is not None:
            if (prior.question, prior.answer, prior.steps) != (rec.question, rec.answer, rec.steps):
                raise InputError(str(path), line, id_field, f"id '{ext}' already used on line {prior.line}")
            continue
        seen[ext] = rec
        records.append(rec)
    return records


def ingest_file(
    db: Database,
    path: Path | str,
    set_name: str,
    fields: FieldMap,
    *,
    prompt_template: str = GENERIC_PROMPT,
    grader: Grader | None = None,
    update: bool = False,
    objects: list[tuple[int, Any]] | None = None,
) -> IngestReport:
    """Validate the whole file, then add what is new in one transaction.

    A record whose id exists with another question or answer is an error naming its line
    (nothing is written), unless ``update``: then the problem takes the new content and the
    work it invalidates is redone: a new answer re-grades the stored rollouts (no sampling),
    a new question drops what was sampled for the old one.
    """
    records = parse_records(path, fields, objects)
    grader = grader or Grader()
    new_problems = new_trajs = 0
    regrade_ids: list[int] = []
    changed: list[tuple[Record, str]] = []
    with db.session() as s:
        pset = queries.ensure_set(s, set_name)
        # Known records hit the unique key and are skipped: no need to look them up first.
        for start in range(0, len(records), 500):
            new_problems += queries.insert_ignore(
                s,
                Problem,
                [
                    {
                        "problem_set_id": pset.id,
                        "external_id": r.external_id,
                        "question": r.question,
                        "reference_answer": r.answer,
                        "meta": r.meta,
                    }
                    for r in records[start : start + 500]
                ],
            )
        ids = queries.existing_problem_ids(s, pset.id, [r.external_id for r in records])
        changed = _changed_problems(s, path, set_name, pset.id, records, update=update)
        if changed:
            queries.update_problems(s, [(ids[r.external_id], r.question, r.answer, r.meta) for r, _ in changed])
            question_changed = [ids[r.external_id] for r, field in changed if field == "question"]
            # Whatever was sampled for another question is void; the file's own steps come back below.
            queries.delete_trajectories_of(s, question_changed)
            answer_changed = [ids[r.external_id] for r, field in changed if field == "answer"]
            regrade_ids = queries.trajectory_ids_of(s, answer_changed)
        known = queries.ingested_texts(s, sorted({ids[r.external_id] for r in records if r.steps is not None}))
        for r in records:
            if r.steps is None:
                continue
            chunks = join_steps(r.steps)
            text = "".join(chunks)
            if (ids[r.external_id], text) in known:  # already here, from this file or another
                continue
            known.add((ids[r.external_id], text))
            final = extract_boxed(text)
            outcome = r.outcome
            if outcome is None and r.answer:
                outcome = bool(grader.grade(text, r.answer).reward)
            truth = (
                [None] * len(chunks)
                if r.first_error is None
                else [r.first_error == -1 or i < r.first_error for i in range(len(chunks))]
            )
            tid = queries.add_trajectory(
                s,
                {
                    "problem_id": ids[r.external_id],
                    "source_key": f"ingested:{path.name if isinstance(path, Path) else path}",
                    "prompt": prompt_template.format(question=r.question),
                    "text": text,
                    "final_answer": final,
                    "outcome": outcome,
                    "n_chunks": len(chunks),
                    "segmentation": GIVEN_STEPS,
                    "generator": "ingested",
                    "seed": None,
                },
                [{"idx": i + 1, "text": c, "ground_truth": truth[i]} for i, c in enumerate(chunks)],
            )
            new_trajs += tid is not None
        if regrade_ids:
            queries.regrade_outcomes(s, regrade_ids, lambda text, ref: bool(grader.grade(text, ref).reward))
    if regrade_ids:
        from stepq.workers.labelling.regrade import regrade_trajectories

        regrade_trajectories(db, set_name, regrade_ids, grader)
    return IngestReport(len(records), new_problems, new_trajs, len(changed))


def _changed_problems(
    session: Any, path: Path | str, set_name: str, set_id: int, records: list[Record], *, update: bool
) -> list[tuple[Record, str]]:
    """Records whose id exists with other content, with what changed (question first)."""
    stored = queries.problem_contents(session, set_id, [r.external_id for r in records])
    out: list[tuple[Record, str]] = []
    for r in records:
        question, answer = stored[r.external_id]
        field = "question" if question != r.question else "answer" if answer != r.answer else None
        if field is None:
            continue
        if not update:
            raise InputError(
                str(path),
                r.line,
                field,
                f"problem '{r.external_id}' is already in set '{set_name}' with another {field}; "
                "pass --update to replace it (its annotation is redone)",
            )
        out.append((r, field))
    return out
