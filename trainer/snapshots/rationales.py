"""A generative judge's supervised start: a teacher's rationales for a snapshot's chunks, kept
where the teacher's verdict agrees with the chunk's Monte Carlo label.

GenPRM and ThinkPRM fine-tune their verifiers on synthesized rationales kept where the verdict
agrees with the step's label (rejection sampling).  Here the teacher is any generation
backend (the OpenAI-compatible one for a hosted model), asked the snapshot's training chunks
with the judge template the student will be asked with; each chunk keeps at most one
agreeing rationale, the first of its ``samples`` (seeded, so a rerun keeps the same ones).
The records are what ``stepq train --method sft --data DIR`` reads.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepq.models import Database
from stepq.models.snapshots import TRAIN
from stepq.trainer.generative_judge.prompt import POSITIVE, JudgePrompt, parse_verdict
from stepq.trainer.snapshots.export import snapshot_records
from stepq.workers.backends.base import GenerationBackend, GenerationRequest, SamplingParams
from stepq.workers.seeds import derive_seed

MANIFEST = "manifest.json"


@dataclass
class RationaleReport:
    """Chunks asked and rationales kept, per label; answers without a verdict."""

    asked: Counter[str] = field(default_factory=Counter)
    kept: Counter[str] = field(default_factory=Counter)
    answers: int = 0
    no_verdict: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "asked": dict(self.asked),
            "kept": dict(self.kept),
            "answers": self.answers,
            "no_verdict": self.no_verdict,
        }


def teacher_rationales(
    db: Database,
    snapshot: str | int,
    teacher: GenerationBackend,
    params: SamplingParams,
    *,
    template: JudgePrompt,
    chat_template: bool = True,
    samples: int = 4,
    seed: int = 0,
    batch: int = 64,
) -> tuple[list[dict[str, Any]], RationaleReport]:
    """The snapshot's training chunks, each with the first of the teacher's ``samples``
    answers whose verdict agrees with the chunk's label (chunks with none are left out)."""
    rows = snapshot_records(db, snapshot, template)[TRAIN]
    report = RationaleReport()
    records: list[dict[str, Any]] = []
    format_prompt = getattr(teacher, "format_prompt", None) if chat_template else None
    for start in range(0, len(rows), batch):
        part = rows[start : start + batch]
        requests = [
            GenerationRequest(
                format_prompt(r["prompt"]) if format_prompt is not None else r["prompt"],
                tuple(derive_seed("rationale", seed, r["chunk_id"], k) for k in range(samples)),
            )
            for r in part
        ]
        for row, answers in zip(part, teacher.generate(requests, params), strict=True):
            report.asked[row["label"]] += 1
            wanted = row["label"] == POSITIVE
            report.answers += len(answers)
            verdicts = [parse_verdict(a.text) for a in answers]
            report.no_verdict += sum(v is None for v in verdicts)
            agreeing = next((a for a, v in zip(answers, verdicts, strict=True) if v is wanted), None)
            if agreeing is None:
                continue
            report.kept[row["label"]] += 1
            records.append(
                {
                    "prompt": row["prompt"],
                    "completion": agreeing.text,
                    "label": row["label"],
                    "chunk_id": row["chunk_id"],
                }
            )
    return records, report


def write_rationales(
    out: Path, records: Sequence[dict[str, Any]], report: RationaleReport, template: JudgePrompt, **about: Any
) -> None:
    """``train.jsonl`` (prompt, completion) and a manifest naming the template the prompts
    were rendered with, which the student is then asked with."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "train.jsonl").open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    manifest = {"template": template.template, "counts": report.as_dict(), **about}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
