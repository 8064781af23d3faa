"""``stepq train --method sft`` records with ``untaught`` text: read by the judge, kept out of
the loss; records without it taught exactly as TRL's own prompt-completion path teaches them.

Real TRL (its ``SFTTrainer``'s prepared dataset) on a tiny model with a character tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepq.models import Database
from stepq.models.errors import ConfigError
from stepq.trainer.methods.base import TrainingData
from stepq.trainer.methods.sft import SFT, load_judge_records, taught_tokens
from stepq.trainer.tiny_model import build_tiny_model
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.runs import TrainOptions

PROMPT = "Step: 45-7=38\nCheck:"
ANALYSIS = " 45-7=38 vs 38\n3=3 8=8\n"
VERDICT = "\\boxed{Positive}"


def _recipe(model: Path, conversational: bool = False) -> Recipe:
    return Recipe.parse(
        f"method: sft\nmodel: {model}\nconversational: {str(conversational).lower()}\n"
        "trainer:\n  max_steps: 1\n  max_length: 256\n  use_cpu: true\n  bf16: false\n  report_to: none\n"
    )


def test_a_record_without_untaught_text_is_taught_as_trl_teaches_it(tmp_path: Path) -> None:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    model = build_tiny_model(tmp_path / "base", n_positions=256)
    tokenizer = AutoTokenizer.from_pretrained(model)
    record = {"prompt": PROMPT, "completion": ANALYSIS + VERDICT}
    args = SFTConfig(output_dir=str(tmp_path / "out"), use_cpu=True, max_length=256, report_to="none")
    trl_row = SFTTrainer(model=str(model), args=args, train_dataset=Dataset.from_list([record])).train_dataset[0]
    ours = taught_tokens(tokenizer, record, tokenizer.eos_token)
    assert ours == {"input_ids": trl_row["input_ids"], "labels": trl_row["labels"]}


def test_untaught_text_is_read_but_not_in_the_loss(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    model = build_tiny_model(tmp_path / "base", n_positions=256)
    tokenizer = AutoTokenizer.from_pretrained(model)
    row = taught_tokens(tokenizer, {"prompt": PROMPT, "completion": ANALYSIS, "untaught": VERDICT}, "<eos>")
    assert tokenizer.decode(row["input_ids"]) == PROMPT + ANALYSIS + VERDICT + "<eos>"  # the judge reads it all
    taught = [t for t in row["labels"] if t != -100]
    assert tokenizer.decode(taught) == ANALYSIS  # the loss: the analysis alone, no verdict, no end of text
    first = row["labels"].index(taught[0])
    assert row["labels"][first : first + len(taught)] == taught  # one span, right after the prompt
    assert first == len(tokenizer(text=PROMPT)["input_ids"])


def test_the_method_teaches_mixed_records_each_its_own_way(sqlite: Database, tmp_path: Path) -> None:
    from trl import SFTTrainer

    model = build_tiny_model(tmp_path / "base", n_positions=256)
    records = [
        {"prompt": PROMPT, "completion": ANALYSIS + VERDICT},
        {"prompt": PROMPT, "completion": ANALYSIS, "untaught": "\\boxed{Negative}"},
    ]
    plan = SFT().plan(sqlite, _recipe(model), TrainingData(records=records, name="r"), tmp_path / "o", TrainOptions())
    rows = list(SFTTrainer(**plan.arguments).train_dataset)
    taught = [sum(t != -100 for t in r["labels"]) for r in rows]
    assert taught == [len(ANALYSIS + VERDICT) + 1, len(ANALYSIS)]  # a token a character, the end of text on the first
    settings = plan.side_files["stepq-judge.json"]
    assert settings["max_tokens"] >= len(ANALYSIS + "\\boxed{Negative}") + 1  # room for the whole answer read
    with pytest.raises(ConfigError, match="without a chat template"):
        SFT().plan(
            sqlite, _recipe(model, True), TrainingData(records=records, name="r"), tmp_path / "c", TrainOptions()
        )


def test_a_records_folder_may_carry_untaught_text_and_refuses_a_wrong_one(tmp_path: Path) -> None:
    lines = [{"prompt": "p", "completion": "c", "untaught": "v"}, {"prompt": "p", "completion": "c"}]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    assert load_judge_records(tmp_path)[0] == lines
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "p", "completion": "c", "untaught": 3}))
    with pytest.raises(ConfigError, match=r"train\.jsonl:1: 'untaught' is text"):
        load_judge_records(tmp_path)
