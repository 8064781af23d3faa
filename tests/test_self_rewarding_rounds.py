"""The process-based self-rewarding loop, two rounds on a tiny model (CPU): round 1 searches
with the base model as policy and pairwise judge, step-wise DPO trains on its pairs, and round
2 searches with the model round 1 trained, as policy and judge, recorded in the database; then
DPO again from that model.  The commands are the ones docs/training.md gives."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text

from stepq.models import Database
from stepq.trainer.tiny_model import build_tiny_model
from stepq.workers.backends import GenerationRequest, SamplingParams, make_backend
from stepq.workers.data.segmentation import next_chunk
from stepq.workers.search.step_search import SearchSpec, candidate_seeds
from tests.helpers import DATA, clean_env, run_stepq

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DPO = (
    "method: dpo\nmodel: {model}\ntrainer:\n  beta: 0.1\n  learning_rate: 1.0e-3\n  max_length: 512\n"
    "  per_device_train_batch_size: 2\n  max_steps: 2\n  save_steps: 2\n  logging_steps: 1\n"
    "  use_cpu: true\n  seed: 0\n"
)


def test_two_rounds_each_searching_with_the_model_the_last_one_trained(sqlite: Database, tmp_path: Path) -> None:
    env = clean_env(STEPQ_DATABASE_URL=str(sqlite.engine.url))

    def stepq(*args: str) -> subprocess.CompletedProcess[str]:
        done = run_stepq(*args, env=env, cwd=tmp_path, timeout=600)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    base = build_tiny_model(tmp_path / "base", n_positions=2048)  # the judge's prompt with the method's template
    problems = tmp_path / "p.jsonl"
    problems.write_text("".join(DATA.joinpath("gsm8k_sample.jsonl").read_text().splitlines(keepends=True)[:3]))
    (tmp_path / "dpo.yaml").write_text(DPO.format(model=base))
    stepq("ingest", str(problems), "--set", "g")
    # the set's policy: the tiny model (annotate records a set's backend; it needs trajectories)
    stepq("generate", "--set", "g", "--samples", "1", "--backend", "hf", "--model", str(base), "--max-tokens", "12")
    stepq("annotate", "--set", "g", "--rollouts", "1", "--backend", "hf", "--model", str(base), "--max-tokens", "12")
    search = ("--width", "4", "--max-turns", "2", "--judge-verdict-by", "logprob")
    stepq(
        "search",
        "start",
        "--set",
        "g",
        "--name",
        "round1",
        *search,
        "--judge-backend",
        "hf",
        "--judge-model",
        str(base),
    )
    stepq("search", "run")
    stepq("train", "--method", "dpo", "--recipe", "dpo.yaml", "--search", "round1", "--output", "runs/round1")
    started = stepq("search", "start", "--set", "g", "--name", "round2", *search, "--from-run", "runs/round1")
    assert "policy and judge from training run" in started.stdout
    stepq("search", "run")
    stepq(
        "train", "--method", "dpo", "--recipe", "dpo.yaml", "--model", "runs/round1/final", "--search", "round2",
        "--output", "runs/round2",
    )  # fmt: skip

    round1_model = str((tmp_path / "runs" / "round1" / "final").resolve())
    with sqlite.engine.connect() as conn:
        runs = {
            name: (rid, base_model, dataset)
            for rid, name, base_model, dataset in conn.execute(
                text("SELECT id, output_dir, base_model, dataset FROM training_runs WHERE status = 'done'")
            )
        }
        searches = conn.execute(
            text(
                "SELECT s.name, s.policy_model, s.policy_run_id, s.judge_backend, s.judge_config, s.prompt, "
                "s.seed, s.width, s.max_turns, s.scoring, p.question, t.candidates, s.sampling, s.segmentation "
                "FROM step_searches s "
                "JOIN problems p ON p.id = s.problem_id "
                "JOIN search_turns t ON t.search_id = s.id AND t.turn = 0 ORDER BY s.name, s.id"
            )
        ).all()
    round1_run, _, dataset1 = runs[str((tmp_path / "runs" / "round1").resolve())]
    _, base2, dataset2 = runs[str((tmp_path / "runs" / "round2").resolve())]
    assert dataset1 == "preferences:search:round1" and dataset2 == "preferences:search:round2"
    assert Path(base2).resolve() == Path(round1_model), "round 2 trains on from round 1's model"
    by_round: dict[str, list] = {"round1": [], "round2": []}
    for row in searches:
        by_round[row[0]].append(row)
    assert len(by_round["round1"]) == len(by_round["round2"]) == 3
    for row in by_round["round1"]:
        assert row[1] is None and row[2] is None, "round 1 searches with the set's own model"
    for row in by_round["round2"]:
        config = json.loads(row[4]) if isinstance(row[4], str) else row[4]
        assert (row[1], row[2], row[3], config["model"]) == (round1_model, round1_run, "hf", round1_model)
    # round 2's candidates are what round 1's model samples with their seeds, not the base's:
    # with the search's own sampling (the method's T and top_p over the set's max tokens), cut
    # with the set's segmentation, from the prompt the set's trajectories were sampled from
    trained, untrained = make_backend("hf", {"model": round1_model}), make_backend("hf", {"model": str(base)})
    differs = 0
    with sqlite.engine.connect() as conn:
        trajectory_prompts = {str(p) for (p,) in conn.execute(text("SELECT prompt FROM trajectories"))}
    for row in by_round["round2"]:
        name, _, _, _, _, prompt, seed, width, max_turns, scoring, question, candidates, sampling, cut = row
        sampling = json.loads(sampling) if isinstance(sampling, str) else sampling
        assert (sampling["temperature"], sampling["top_p"]) == (0.5, 0.95)
        assert prompt in trajectory_prompts
        params = SamplingParams.from_config({"max_tokens": 12, **sampling})
        stored = json.loads(candidates) if isinstance(candidates, str) else candidates
        spec = SearchSpec(name, question, prompt, width, max_turns, seed, segmentation=cut, scoring=scoring)
        request = [GenerationRequest(prompt, candidate_seeds(spec, 0))]
        assert [next_chunk(c.text, cut)[0] for c in trained.generate(request, params)[0]] == stored
        differs += [next_chunk(c.text, cut)[0] for c in untrained.generate(request, params)[0]] != stored
    assert differs > 0, "the trained model samples differently from the base (else this proves nothing)"
    status = json.loads(stepq("search", "status", "--json").stdout)
    assert {s["search"]: s["policy_runs"] for s in status} == {"round1": [], "round2": [round1_run]}
