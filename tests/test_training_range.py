"""A judge's training range kept with it, and an evaluation on problems outside it said so."""

from __future__ import annotations

import json
from pathlib import Path

from stepq.migrations import upgrade
from stepq.models import Database
from stepq.trainer.generative_judge.judge_prompting import FILE, JudgeSettings, settings_for_model
from stepq.trainer.generative_judge.training_range import describe_sets, range_note
from stepq.trainer.tiny_model import build_tiny_model
from stepq.workers.data.synthetic_set import synth_set
from tests.helpers import clean_env, run_stepq


def _db(tmp_path: Path) -> tuple[Database, str]:
    url = f"sqlite:///{tmp_path / 'stepq.db'}"
    upgrade(url)
    db = Database(url)
    synth_set(db, "small", problems=3, seed=1, numbers="small")
    synth_set(db, "wide", problems=3, seed=1)
    return db, url


def test_a_set_of_other_numbers_is_outside_a_judges_range(tmp_path: Path) -> None:
    db, _ = _db(tmp_path)
    small = describe_sets(db, ["small"])
    assert small == ({"set": "small", "backend": "synthetic", "numbers": "small"},)
    assert range_note(small, db, "small") is None
    note = range_note(small, db, "wide")
    assert note is not None and "default numbers" in note and "'small' (synthetic problems of small numbers)" in note
    assert range_note((), db, "wide") is None, "a judge trained elsewhere: nothing is known, nothing is said"
    assert range_note([{"set": "gsm", "backend": "vllm"}], db, "wide") is not None
    # the settings file keeps the range through a save and a load
    JudgeSettings("{problem}{history}{chunk}", trained_on=small).save(tmp_path / "judge")
    assert settings_for_model(tmp_path / "judge").trained_on == small


def test_eval_chunk_reset_says_when_a_set_is_outside_the_judges_range(tmp_path: Path) -> None:
    db, url = _db(tmp_path)
    model = build_tiny_model(tmp_path / "judge", n_positions=2048)
    JudgeSettings(
        "{problem}\n{history}\n{chunk}\n", chat_template=False, max_tokens=4, trained_on=describe_sets(db, ["small"])
    ).save(model)
    env = clean_env(STEPQ_DATABASE_URL=url)
    reports = {}
    for name in ("small", "wide"):
        done = run_stepq(
            "eval", "chunk-reset", "--set", name, "--retries", "0", "--judge", "model", "--backend", "hf",
            "--model", str(model), "--json", env=env, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        reports[name] = json.loads(done.stdout)
    assert reports["small"]["outside_training_range"] is None
    assert "outside its training range" in reports["wide"]["outside_training_range"]
    assert reports["wide"]["judge_settings"]["trained_on"][0]["numbers"] == "small"
    assert (model / FILE).is_file()
