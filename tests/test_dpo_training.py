"""Step-wise DPO (TRL's DPOTrainer) on step pairs derived from a set's Q-values, on a tiny
GPT-2 built here (CPU): the run, its checkpoints and metrics are recorded; the same pairs
exported and read back train the same way; the CLI picks the method from the recipe."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.trainer.preferences.export import export_preferences, preference_records
from stepq.trainer.preferences.pair_files import load_preferences
from stepq.trainer.tiny_model import build_tiny_model
from stepq.trainer.training.recipe import Recipe
from tests.helpers import annotated_set, clean_env, run_stepq
from tests.trainer_helpers import train_records

pytestmark = pytest.mark.integration


def _recipe_text(model: Path, max_steps: int = 2) -> str:
    return (
        f"method: dpo\nmodel: {model}\ntrainer:\n  beta: 0.1\n  learning_rate: 1.0e-3\n  max_length: 512\n"
        f"  per_device_train_batch_size: 2\n  max_steps: {max_steps}\n  save_steps: 1\n  logging_steps: 1\n"
        "  use_cpu: true\n  seed: 0\n"
    )


def _pairs_set(db: Database) -> None:
    annotated_set(
        db, "pref", m=8, problems=8, seed=2, trajectories_per_problem=4, error_rate=0.25, worker="t", batch_rollouts=128
    )


def test_dpo_run_on_q_derived_pairs_is_recorded(pg: Database, tmp_path: Path) -> None:
    _pairs_set(pg)
    pairs = preference_records(pg, "pref", 0.3)
    assert len(pairs) >= 4
    model = build_tiny_model(tmp_path / "base", n_positions=1024)
    recipe = Recipe.parse(_recipe_text(model))
    result = train_records(pg, "dpo", pairs, "preferences:pref:margin=0.3", recipe, tmp_path / "run")
    assert result.status == "done" and result.global_step == 2
    with pg.session() as s:
        run = queries.get_run(s, result.run_id)
        assert (run.method, run.dataset, run.snapshot_id, run.status) == (
            "dpo",
            "preferences:pref:margin=0.3",
            None,
            "done",
        )
        assert [Path(c).name for c in run.checkpoints] == ["checkpoint-1", "checkpoint-2"]
        metrics = queries.run_metrics(s, run.id)
        assert [m.step for m in metrics] == [1, 2] and all(m.loss is not None for m in metrics)
        assert any(k.startswith("rewards/") for k in metrics[-1].values), "DPO's reward margins are kept"
    assert (result.final_model / "config.json").exists()
    # the exported pairs read back are the same training data
    export_preferences(pg, "pref", tmp_path / "pairs", margin=0.3, fmt="parquet")
    assert load_preferences(tmp_path / "pairs") == [{k: p[k] for k in ("prompt", "chosen", "rejected")} for p in pairs]
    with pytest.raises(ConfigError, match="not 'dpo'"):
        train_records(pg, "dpo", pairs, "x", Recipe.parse(f"model: {model}\n"), tmp_path / "other")


def test_train_command_runs_dpo_from_a_set(tmp_path: Path) -> None:
    env = clean_env(STEPQ_DATABASE_URL=f"sqlite:///{tmp_path / 's.db'}")

    def stepq(*args: str) -> subprocess.CompletedProcess[str]:
        return run_stepq(*args, env=env, cwd=tmp_path, timeout=600)

    assert stepq("synth", "--set", "p", "--problems", "6", "--trajectories-per-problem", "4").returncode == 0
    assert stepq("run", "--set", "p", "--rollouts", "8").returncode == 0
    model = build_tiny_model(tmp_path / "base", n_positions=1024)
    (tmp_path / "dpo.yaml").write_text(_recipe_text(model, max_steps=1))
    done = stepq("train", "--recipe", str(tmp_path / "dpo.yaml"), "--set", "p", "--margin", "0.25")
    assert done.returncode == 0, done.stderr
    assert "done at step 1" in done.stdout and (tmp_path / "runs" / "dpo-p" / "final").is_dir()
    listed = stepq("train", "list")
    assert listed.returncode == 0 and "dpo" in listed.stdout and "preferences:p" in listed.stdout
    both = stepq("train", "--recipe", str(tmp_path / "dpo.yaml"), "--set", "p", "--data", str(tmp_path))
    assert both.returncode == 2 and "exactly one of --set" in both.stderr
    wrong = stepq("train", "--method", "grpo", "--recipe", str(tmp_path / "dpo.yaml"), "--snapshot", "1")
    assert wrong.returncode != 0 and "not 'grpo'" in wrong.stderr


def _margin(model_dir: Path, pairs: list[dict], tokenizer_dir: Path) -> float:
    """Mean over pairs of log p(chosen | prompt) - log p(rejected | prompt), prompt and
    completion tokenized apart as TRL's DPO does."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()

    def logp(prompt: str, completion: str) -> float:
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        c = tok(completion, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([p + c])
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].log_softmax(-1)
        targets = ids[0, 1:]
        return float(logits[len(p) - 1 :].gather(1, targets[len(p) - 1 :, None]).sum())

    return sum(logp(r["prompt"], r["chosen"]) - logp(r["prompt"], r["rejected"]) for r in pairs) / len(pairs)


def test_dpo_raises_the_chosen_steps_margin_over_the_rejected(sqlite: Database, tmp_path: Path) -> None:
    """After a few DPO steps on the pairs, the policy prefers each pair's chosen step more than
    the base did: with chosen and rejected swapped anywhere on the way, the margin would fall."""
    _pairs_set(sqlite)
    pairs = preference_records(sqlite, "pref", 0.3)[:8]
    model = build_tiny_model(tmp_path / "base", n_positions=1024)
    recipe = Recipe.parse(_recipe_text(model, max_steps=8).replace("save_steps: 1", "save_steps: 8"))
    result = train_records(sqlite, "dpo", pairs, "preferences:pref", recipe, tmp_path / "run")
    before, after = _margin(model, pairs, model), _margin(result.final_model, pairs, model)
    assert after > before + 0.5, (before, after)
