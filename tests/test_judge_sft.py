"""The generative judge's supervised start: a teacher's rationales kept only where their
verdict agrees with the chunk's Monte Carlo label (rejection sampling), then ``stepq train
--method sft`` on them (TRL's SFTTrainer on a tiny model), recorded like every run, the judge
asked afterwards as it was taught, and GRPO started from it.

The teacher is a stand-in (``AlternatingTeacher``): no model that writes verification
rationales can run here.  It answers each seed with a fixed verdict, so which answers must be
kept is known without asking it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from stepq.models import Database, queries
from stepq.models.snapshots import TRAIN, VALIDATION
from stepq.trainer.generative_judge.judge_prompting import settings_for_model
from stepq.trainer.generative_judge.prompt import POSITIVE, JudgePrompt, parse_verdict
from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
from stepq.trainer.snapshots.export import snapshot_records
from stepq.trainer.snapshots.rationales import teacher_rationales, write_rationales
from stepq.trainer.tiny_model import build_tiny_model
from stepq.workers.backends.base import Completion, GenerationRequest, SamplingParams
from stepq.workers.seeds import derive_seed
from tests.helpers import annotated_set, clean_env

pytestmark = pytest.mark.slow


class AlternatingTeacher:
    """Stand-in teacher: an odd seed's answer says Positive, an even one's Negative, and every
    fifth seed's has no verdict at all."""

    name = "stand-in-teacher"
    generator = "stand-in-teacher"

    def __init__(self) -> None:
        self.asked: list[GenerationRequest] = []

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
        self.asked.extend(requests)
        return [[Completion(self.answer(seed), 8) for seed in r.seeds] for r in requests]

    @staticmethod
    def answer(seed: int) -> str:
        if seed % 5 == 0:
            return "I cannot tell."
        return f"1. Analysis: seed {seed}.\n2. Final Judgment: \\boxed{{{'Positive' if seed % 2 else 'Negative'}}}"

    def close(self) -> None:
        pass


def _snapshot(db: Database) -> int:
    annotated_set(db, problems=24, error_rate=0.3, recovery_rate=0.0)
    return create_snapshot(db, SnapshotSpec(("s",), "abs-q", val_fraction=0.3, seed=0))


def test_only_rationales_that_agree_with_the_label_are_kept(sqlite: Database) -> None:
    snapshot = _snapshot(sqlite)
    template = JudgePrompt.load()
    rows = snapshot_records(sqlite, snapshot, template)[TRAIN]
    teacher = AlternatingTeacher()
    records, report = teacher_rationales(
        sqlite, snapshot, teacher, SamplingParams(), template=template, chat_template=False, samples=3, seed=7
    )
    expected = {}  # the first agreeing answer of each chunk, worked out from the seeds alone
    for r in rows:
        answers = [AlternatingTeacher.answer(derive_seed("rationale", 7, r["chunk_id"], k)) for k in range(3)]
        agreeing = [a for a in answers if parse_verdict(a) is (r["label"] == POSITIVE)]
        if agreeing:
            expected[r["chunk_id"]] = agreeing[0]
    assert 0 < len(expected) < len(rows), "some chunks keep a rationale, some have none that agrees"
    assert {r["chunk_id"]: r["completion"] for r in records} == expected
    by_id = {r["chunk_id"]: r for r in rows}
    for record in records:
        assert record["prompt"] == by_id[record["chunk_id"]]["prompt"], "the prompt the student will be asked"
        assert parse_verdict(record["completion"]) is (record["label"] == POSITIVE)
    assert sum(report.asked.values()) == len(rows) and sum(report.kept.values()) == len(records)
    assert report.answers == 3 * len(rows) and report.no_verdict > 0
    assert [r.context for r in teacher.asked] == [r["prompt"] for r in rows], "the training split, each once"


def _completion_logprob(model_dir: Path, prompt: str, completion: str) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    c = tokenizer(completion, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([p + c])).logits[0]
    logp = torch.log_softmax(logits[len(p) - 1 : -1], dim=-1)
    return float(sum(logp[i, t] for i, t in enumerate(c)))


def test_stepq_train_sft_teaches_the_records_and_grpo_starts_from_the_result(sqlite: Database, tmp_path: Path) -> None:
    snapshot = _snapshot(sqlite)
    short = tmp_path / "judge.txt"  # short prompts: the tiny model reads 1024 characters
    short.write_text("P: {problem}\nH: {history}\nC: {chunk}\nVerdict in \\boxed{{}}:")
    template = JudgePrompt.load(short)
    records, report = teacher_rationales(
        sqlite, snapshot, AlternatingTeacher(), SamplingParams(), template=template, chat_template=False, samples=4
    )
    # the teacher's analyses vary by seed; the student is taught one short analysis per verdict
    taught = {True: "ok \\boxed{Positive}", False: "no \\boxed{Negative}"}
    records = [{**r, "completion": taught[r["label"] == POSITIVE]} for r in records]
    write_rationales(tmp_path / "rationales", records, report, template, snapshot=snapshot)
    model = build_tiny_model(tmp_path / "base", n_positions=1024)
    env = clean_env(STEPQ_DATABASE_URL=str(sqlite.engine.url))
    options = [
        "trainer.max_steps=24", "trainer.learning_rate=0.003", "trainer.per_device_train_batch_size=8",
        "trainer.gradient_accumulation_steps=1", "trainer.bf16=false", "trainer.use_cpu=true",
        "trainer.max_length=1024", "trainer.save_steps=12", "trainer.logging_steps=4", "conversational=false",
    ]  # fmt: skip
    command = [sys.executable, "-m", "stepq", "train", "--method", "sft", "--data", str(tmp_path / "rationales")]
    command += ["--model", str(model), "--output", str(tmp_path / "sft")]
    command += [a for o in options for a in ("--recipe-option", o)]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    final = tmp_path / "sft" / "final"
    with sqlite.session() as s:
        run = queries.run_by_output(s, str((tmp_path / "sft").resolve()))
        assert run is not None and (run.method, run.status, run.global_step) == ("sft", "done", 24)
        assert run.dataset == f"judge-records:{(tmp_path / 'rationales').resolve()}"
        assert [Path(c).name for c in run.checkpoints] == ["checkpoint-12", "checkpoint-24"]
    asked = settings_for_model(final)  # asked afterwards as it was taught: the records' template, raw
    assert (asked.template, asked.chat_template, asked.source) == (template.template, False, f"training run {run.id}")
    longest = max(len(t) for t in taught.values())  # the tiny tokenizer: a token a character
    assert longest + 1 <= asked.max_tokens <= longest + 1 + max(16, longest // 2)  # room to answer, not the context

    # learnt: on held-out chunks the taught answer for each label is far likelier than before
    held_out = snapshot_records(sqlite, snapshot, template)[VALIDATION][:6]
    gains = [
        _completion_logprob(final, r["prompt"], taught[r["label"] == POSITIVE])
        - _completion_logprob(model, r["prompt"], taught[r["label"] == POSITIVE])
        for r in held_out
    ]
    assert min(gains) > math.log(100), gains

    # GRPO starts from the supervised judge; the run row names it
    from stepq.api import Stepq

    grpo = Stepq(str(sqlite.engine.url)).train(
        method="grpo",
        snapshot=snapshot,
        model=str(final),
        output=tmp_path / "grpo",
        recipe_options=[
            "trainer.max_steps=1", "trainer.max_completion_length=8", "trainer.per_device_train_batch_size=4",
            "trainer.gradient_accumulation_steps=1", "trainer.activation_checkpointing=false", "trainer.bf16=false",
            "trainer.use_cpu=true", "conversational=false", f"judge_template={short}",
        ],
    )  # fmt: skip
    with sqlite.session() as s:
        assert queries.get_run(s, grpo.run_id).base_model == str(final.resolve())
    assert json.loads((grpo.final_model / "stepq-judge.json").read_text())["source"] == f"training run {grpo.run_id}"
