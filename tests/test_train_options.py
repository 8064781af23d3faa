"""``stepq train`` as a new user meets it on a CPU machine: the shipped recipe asks for bf16
(a clear configuration error naming the key, exit 2), a base model that cannot be loaded is
named, and the recipe is overridable from the command line, validated against the method's
config, with the effective recipe recorded on the run row."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from stepq.cli import main
from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.trainer.tiny_model import build_tiny_model
from stepq.trainer.training.recipe import Recipe
from tests.helpers import annotated_set

CPU_OPTIONS = (
    "trainer.max_steps=1",
    "trainer.max_completion_length=8",
    "trainer.per_device_train_batch_size=4",
    "trainer.gradient_accumulation_steps=1",
    "trainer.activation_checkpointing=false",
    "trainer.save_steps=1",
    "conversational=false",
)


def _train(monkeypatch: pytest.MonkeyPatch, db: Database, *args: str) -> tuple[int, str]:
    monkeypatch.setenv("STEPQ_DATABASE_URL", db.url)
    result = CliRunner().invoke(main, ["train", "--snapshot", "1", *args])
    return result.exit_code, result.output


def _opts(*options: str) -> list[str]:
    return [a for o in options for a in ("--recipe-option", o)]


def test_recipe_options_override_and_validate() -> None:
    base = Recipe.load("stepwiser-judge.yaml")
    changed = base.with_options(["trainer.bf16=false", "trainer.learning_rate=5e-5", "conversational=false"], "m/x")
    assert changed.trainer["bf16"] is False and changed.trainer["learning_rate"] == 5e-5
    assert changed.conversational is False and changed.model == "m/x"
    # the recorded text is the effective recipe
    assert yaml.safe_load(changed.text)["trainer"]["bf16"] is False
    assert base.trainer["bf16"] is True  # the shipped recipe itself is untouched
    # YAML 1.1 reads 5e-5 (no dot) as text; in a recipe file it is the number meant
    assert Recipe.parse("model: m\ntrainer:\n  learning_rate: 5e-5\n").trainer["learning_rate"] == 5e-5
    for bad in ("trainer.bf16", "bogus=1", "model.x=1", "trainer={}"):
        with pytest.raises(ConfigError):
            base.with_options([bad])


def test_a_recipe_silent_on_precision_trains_in_float32_on_the_cpu(tmp_path: Path) -> None:
    # TRL's configs default bf16 to True: on a CPU that is bf16 autocast (emulated, slower),
    # never what a recipe that says nothing asked for
    from trl import DPOConfig, GRPOConfig

    silent = Recipe.parse("model: m\ntrainer:\n  use_cpu: true\n  max_steps: 1\n")
    assert GRPOConfig(output_dir=str(tmp_path), use_cpu=True).bf16 is True  # what TRL alone would do
    for config_cls in (GRPOConfig, DPOConfig):
        config = silent.config(config_cls, tmp_path)
        assert config.bf16 is False and config.fp16 is False and config.max_steps == 1
    # asked for on a CPU it is still refused, by name
    with pytest.raises(ConfigError, match=r"trainer\.bf16"):
        Recipe.parse("model: m\ntrainer:\n  use_cpu: true\n  bf16: true\n").config(GRPOConfig, tmp_path)


@pytest.mark.slow
def test_a_new_user_trains_on_cpu_with_overrides(
    sqlite: Database, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    annotated_set(sqlite, problems=20, error_rate=0.25, recovery_rate=0.0)
    monkeypatch.setenv("STEPQ_DATABASE_URL", sqlite.url)
    assert CliRunner().invoke(main, ["snapshot", "create", "--sets", "s", "--rule", "abs-q"]).exit_code == 0
    monkeypatch.chdir(tmp_path)

    # the shipped recipe as it is: its base model is a hub id, and bf16 needs a GPU
    missing = str(tmp_path / "no-such-model")
    code, out = _train(monkeypatch, sqlite, "--model", missing, *_opts("trainer.bf16=false"))
    assert code == 2 and "no-such-model" in out and "no such folder" in out, out
    model = build_tiny_model(tmp_path / "tiny", n_positions=2048)
    code, out = _train(monkeypatch, sqlite, "--model", str(model))
    assert code == 2 and "trainer.bf16" in out and "--recipe-option trainer.bf16=false" in out, out
    # a field the method's config does not have is named
    code, out = _train(monkeypatch, sqlite, "--model", str(model), *_opts("trainer.bf16=false", "trainer.nope=1"))
    assert code == 2 and "nope" in out, out
    with sqlite.session() as s:
        assert queries.training_progress(s) == []  # no error left a run row behind

    code, out = _train(monkeypatch, sqlite, "--model", str(model), *_opts("trainer.bf16=false", *CPU_OPTIONS))
    assert code == 0, out
    assert "done at step 1" in out
    with sqlite.session() as s:
        (row,) = queries.training_progress(s)
        run = queries.get_run(s, row["run"])
        recorded = yaml.safe_load(run.recipe)
        assert run.base_model == str(model) and recorded["model"] == str(model)
        assert recorded["trainer"]["bf16"] is False and recorded["trainer"]["max_steps"] == 1
        assert recorded["trainer"]["epsilon_high"] == 0.28  # the rest of the shipped recipe stays


def test_the_judge_recipe_credits_the_paper_only_for_what_it_states() -> None:
    """The StepWiser recipe marks each setting the paper does not state as stepq's choice."""
    from stepq.trainer.training.recipe import Recipe

    text = Recipe.load("stepwiser-judge.yaml").text
    lines = {line.split(":")[0].strip(): line for line in text.splitlines() if ":" in line and not line.startswith("#")}
    for stated in ("num_generations", "learning_rate", "epsilon", "epsilon_high"):
        assert "paper" in lines[stated], stated
    for chosen in ("beta", "scale_rewards"):
        assert "stepq" in lines[chosen], chosen
    assert "# stepq: the paper does not say how its loss is normalised" in text
    assert "# stepq: the batch shape" in text


def test_grpo_warns_about_a_model_whose_positions_left_padding_shifts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TRL's training pass gives no position ids to left-padded prompts: fine for rotary
    positions, not for GPT-2's learned ones (the judge benchmark did not learn with GPT-2)."""
    import logging

    from stepq.trainer.methods.grpo import warn_if_positions_shift
    from stepq.trainer.tiny_model import build_tiny_llama, build_tiny_model

    with caplog.at_level(logging.WARNING, logger="stepq.trainer.methods.grpo"):
        warn_if_positions_shift(str(build_tiny_model(tmp_path / "gpt2")))
        assert "absolute position embeddings" in caplog.text
        caplog.clear()
        warn_if_positions_shift(str(build_tiny_llama(tmp_path / "llama", hidden_size=64)))
        assert caplog.text == ""
