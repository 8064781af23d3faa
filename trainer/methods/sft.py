"""The generative judge's supervised start: TRL's ``SFTTrainer`` on (judge prompt, analysis
and verdict) records.

Where the records come from is data, not the trainer: a teacher's rationales kept where they
agree with the Monte Carlo label (``stepq export rationales``), a programmatic analysis (such
as the benchmarks' spelled check, taught through this method), or any folder
of ``prompt``/``completion`` lines.  The judge keeps ``stepq-judge.json`` beside its weights
like a GRPO judge, so ``stepq eval`` asks it as it was taught, and a GRPO recipe can start
from it (``--model RUN/final``: the run row records it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stepq.models import Database
from stepq.models.errors import ConfigError
from stepq.trainer.generative_judge.judge_prompting import FILE as JUDGE_SETTINGS
from stepq.trainer.generative_judge.judge_prompting import JudgeSettings
from stepq.trainer.generative_judge.prompt import JudgePrompt
from stepq.trainer.methods.base import Method, TrainingData, base_model
from stepq.trainer.snapshots.rationales import MANIFEST
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.runs import RunPlan, RunSpec, TrainOptions

FIELDS = ("prompt", "completion")
UNTAUGHT = "untaught"
"""A record's optional text after its completion: in the sequence the judge reads, not in the
loss (a verdict that is not the labels' own, shown so the analysis before it reads whole)."""


def load_judge_records(folder: Path) -> tuple[list[dict[str, str]], str | None]:
    """A folder's ``train.jsonl`` records and the template its prompts were rendered with
    (its manifest's, if it has one)."""
    path = folder / "train.jsonl"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror} (write one with 'stepq export rationales')") from None
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not all(isinstance(row.get(k), str) for k in FIELDS):
            raise ConfigError(f"{path}:{n}: a record needs text 'prompt' and 'completion'")
        if not isinstance(row.get(UNTAUGHT, ""), str):
            raise ConfigError(f"{path}:{n}: '{UNTAUGHT}' is text after the completion, not {row[UNTAUGHT]!r}")
        records.append({k: row[k] for k in (*FIELDS, UNTAUGHT) if k in row})
    manifest = folder / MANIFEST
    template = json.loads(manifest.read_text(encoding="utf-8")).get("template") if manifest.is_file() else None
    return records, template


class SFT(Method):
    name = "sft"
    recipe = "judge-sft.yaml"
    summary = "a generative judge's supervised start on prompt/completion records (--data)"

    def plan(
        self, db: Database, recipe: Recipe, data: TrainingData, output_dir: Path, options: TrainOptions
    ) -> RunPlan:
        source = data.only(self.name, "--data", "records")
        template: str | None = None
        if source == "--data":
            assert data.data_dir is not None
            records, template = load_judge_records(data.data_dir)
            dataset = f"judge-records:{data.data_dir.resolve()}"
        else:
            given = data.records or ()
            records, dataset = [{k: r[k] for k in (*FIELDS, UNTAUGHT) if k in r} for r in given], data.source()
        if not records:
            raise ConfigError(f"{dataset} has no records to train on")
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        model = base_model(recipe, options)
        config = recipe.config(SFTConfig, output_dir, **(options.trainer_overrides or {}))
        named = JudgePrompt.load(recipe.judge_template).template if recipe.judge_template else None
        if template is not None and named is not None and named != template:
            raise ConfigError(
                f"{dataset}: its prompts were rendered with another template than the recipe's judge_template "
                "(the judge is asked as its records were written: drop judge_template)"
            )
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
        prompting = JudgeSettings(
            template or named or JudgePrompt.load().template, recipe.conversational, answer_room(tokenizer, records)
        )
        if any(r.get(UNTAUGHT) for r in records):
            if recipe.conversational:
                raise ConfigError(f"{dataset}: '{UNTAUGHT}' text is taught without a chat template only")
            rows = [taught_tokens(tokenizer, r, config.eos_token or tokenizer.eos_token) for r in records]
        else:
            rows = [_record(r, recipe.conversational) for r in records]
        return RunPlan(
            RunSpec(self.name, recipe.text, model, output_dir, dataset=dataset),
            SFTTrainer,
            {"model": model, "args": config, "train_dataset": Dataset.from_list(rows)},
            max_steps=max(0, int(config.max_steps or 0)),
            side_files={JUDGE_SETTINGS: prompting.as_dict()},
        )


def answer_room(tokenizer: Any, records: list[dict[str, str]]) -> int:
    """How many tokens the judge may write when asked: the longest answer it was taught (with
    any untaught text it read after it), in the base model's tokens, with half as much again to
    spare (an analysis of a longer step runs longer); a judge that never stops is cut there, not
    at the model's whole context."""
    answers = (r["completion"] + r.get(UNTAUGHT, "") for r in records)
    longest = max(len(tokenizer.encode(a, add_special_tokens=False)) for a in answers)
    return longest + 1 + max(16, longest // 2)


def taught_tokens(tokenizer: Any, record: dict[str, str], eos: str) -> dict[str, list[int]]:
    """A record as the tokens the judge reads and the labels it is taught: the loss on the
    completion and the end of text, as TRL's prompt-completion path takes it, except on the
    record's ``untaught`` text (and the end of text after it), which the judge reads only.  TRL
    leaves a dataset with ``input_ids`` and ``labels`` as given."""
    from trl.data_utils import common_prefix_length  # where TRL itself starts a completion

    prompt, taught, shown = record["prompt"], record["prompt"] + record["completion"], record.get(UNTAUGHT, "")
    text = taught + shown
    ids = tokenizer(text=text if text.endswith(eos) else text + eos)["input_ids"]
    start = common_prefix_length(tokenizer(text=prompt)["input_ids"], ids)
    end = common_prefix_length(tokenizer(text=taught)["input_ids"], ids) if shown else len(ids)
    return {"input_ids": ids, "labels": [t if start <= i < end else -100 for i, t in enumerate(ids)]}


def _record(record: dict[str, str], conversational: bool) -> dict[str, Any]:
    """A prompt-completion record, as chat messages when the judge is asked through its chat
    template (TRL applies it, and takes the loss on the completion only either way)."""
    if not conversational:
        return {"prompt": record["prompt"], "completion": record["completion"]}
    return {
        "prompt": [{"role": "user", "content": record["prompt"]}],
        "completion": [{"role": "assistant", "content": record["completion"]}],
    }
