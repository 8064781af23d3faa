"""The discriminative PRM trainer on a tiny model (CPU): trained from a set's outcomes in
PostgreSQL with its run recorded, resumed after a failure to exactly the uninterrupted
result, and used as a scoring judge by the evaluation commands (ProcessBench with a tuned
threshold, Best-of-N)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.trainer.methods.prm import set_outcomes
from stepq.trainer.prm.model import StepScorer, encode
from stepq.trainer.prm.train import (
    BatchOrder,
    OutcomeExample,
    PRMConfig,
    load_outcomes,
)
from stepq.trainer.tiny_model import build_tiny_model
from stepq.trainer.training.recipe import Recipe
from stepq.trainer.training.runs import TrainOptions
from tests.helpers import DATA, annotated_set, clean_env, run_stepq
from tests.trainer_helpers import prm_recipe, train_records

SAMPLE = DATA / "processbench_gsm8k_sample.json"


def _set(db: Database, name: str = "o") -> None:
    annotated_set(
        db, name, m=4, problems=6, seed=4, trajectories_per_problem=2, error_rate=0.3, worker="t", batch_rollouts=128
    )


def test_encoding_marks_each_steps_last_token(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "m"))
    e = encode(tok, "Q?", ["Step 1: a.\n\n", "Step 2: b."], max_length=100)
    text = tok.decode(e.ids)
    assert text == "Q?\n\nStep 1: a.\n\nStep 2: b."
    assert [tok.decode(e.ids[: end + 1]) for end in e.ends] == ["Q?\n\nStep 1: a.\n\n", text]
    cut = encode(tok, "Q?", ["Step 1: a.\n\n", "Step 2: b."], max_length=len(e.ids) - 1)
    assert cut.ends == e.ends[:1], "a step that does not fit is left out, not cut"


@pytest.mark.integration
def test_prm_trains_on_a_sets_outcomes_and_is_recorded(pg: Database, tmp_path: Path) -> None:
    _set(pg)
    examples = set_outcomes(pg, "o")
    assert len(examples) > 12 and {e.outcome for e in examples} == {True, False}
    model = build_tiny_model(tmp_path / "base", n_positions=512)
    result = train_records(pg, "prm", examples, "outcomes:o", prm_recipe(model), tmp_path / "run")
    assert result.status == "done" and result.global_step == 4 and result.resumed_from is None
    with pg.session() as s:
        run = queries.get_run(s, result.run_id)
        assert (run.method, run.dataset, run.snapshot_id, run.status) == ("prm", "outcomes:o", None, "done")
        assert [Path(c).name for c in run.checkpoints] == ["checkpoint-2", "checkpoint-4"]
        assert [m.step for m in queries.run_metrics(s, run.id)] == [1, 2, 3, 4]
        assert all(m.loss is not None and m.loss > 0 for m in queries.run_metrics(s, run.id))
        listed = {r["run"]: r for r in queries.training_progress(s)}[run.id]
        assert listed["method"] == "prm" and listed["dataset"] == "outcomes:o" and listed["snapshot"] is None
    scorer = StepScorer.load(result.final_model)
    assert scorer.meta["aggregate"] == "asymmetric"
    scores = scorer.score([(examples[0].problem, examples[0].steps), ("Q?", ["a", "b", "c"])])
    assert [len(r) for r in scores] == [len(examples[0].steps), 3]
    assert all(x is not None and 0.0 < x < 1.0 for row in scores for x in row)
    again = train_records(pg, "prm", examples, "outcomes:o", prm_recipe(model), tmp_path / "run")
    assert (again.run_id, again.global_step) == (result.run_id, 4), "a finished run is reported, not redone"
    with pytest.raises(ConfigError, match="belongs to training run"):
        train_records(pg, "prm", examples, "outcomes:other", prm_recipe(model), tmp_path / "run")
    shutil.rmtree(result.final_model)  # the model deleted by hand: the run's row says done
    with pytest.raises(ConfigError, match=f"training run {result.run_id} finished, but its model is gone"):
        train_records(pg, "prm", examples, "outcomes:o", prm_recipe(model), tmp_path / "run")


class Stop(Exception):
    pass


def test_a_failed_prm_run_resumes_to_the_uninterrupted_result(sqlite: Database, tmp_path: Path) -> None:
    _set(sqlite)
    examples = set_outcomes(sqlite, "o")
    model = build_tiny_model(tmp_path / "base", n_positions=512)
    # a warmup and a short-first curriculum longer than the crash point: the resumed run must
    # pick the schedule and the batch order up by step
    median_length = sorted(len(e.steps) for e in examples)[len(examples) // 2]
    scheduled = "  warmup_steps: 5\n  max_grad_norm: 0.5\n  curriculum_steps: 4\n"
    scheduled += f"  curriculum_max_solution_steps: {median_length}\n"
    straight = train_records(
        sqlite, "prm", examples, "outcomes:o", prm_recipe(model, 6, 2, extra=scheduled), tmp_path / "straight"
    )

    steps = []

    def crash() -> None:
        steps.append(1)
        if len(steps) == 3:
            raise Stop

    with pytest.raises(Stop):
        train_records(
            sqlite,
            "prm",
            examples,
            "outcomes:o",
            prm_recipe(model, 6, 2, extra=scheduled),
            tmp_path / "crashed",
            TrainOptions(on_step=crash),
        )
    with sqlite.session() as s:
        failed = queries.run_by_output(s, str((tmp_path / "crashed").resolve()))
        assert failed is not None and failed.status == "failed" and "Stop" in (failed.error or "")
    resumed = train_records(
        sqlite, "prm", examples, "outcomes:o", prm_recipe(model, 6, 2, extra=scheduled), tmp_path / "crashed"
    )
    assert resumed.run_id == failed.id and resumed.global_step == 6
    assert resumed.resumed_from is not None and resumed.resumed_from.endswith("checkpoint-2")
    with sqlite.session() as s:
        assert queries.get_run(s, resumed.run_id).resumes == 1
    a, b = StepScorer.load(straight.final_model), StepScorer.load(resumed.final_model)
    for (name, x), (_, y) in zip(a.backbone.state_dict().items(), b.backbone.state_dict().items(), strict=True):
        assert torch.equal(x, y), f"{name} differs after resuming"
    for x, y in zip(a.head.parameters(), b.head.parameters(), strict=True):
        assert torch.equal(x, y), "the head differs after resuming"


def test_prm_recipes_and_data_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not one of"):
        prm_recipe(tmp_path, aggregate="max").config(PRMConfig)
    with pytest.raises(ConfigError, match="PRMConfig has no field"):
        Recipe.parse("method: prm\nmodel: x\ntrainer:\n  num_generations: 4\n").config(PRMConfig)
    with pytest.raises(ConfigError, match="not 'prm'"):
        Recipe.parse("model: x\n").expect("prm")
    with pytest.raises(ConfigError, match="max_grad_norm positive"):
        prm_recipe(tmp_path, extra="  max_grad_norm: 0\n").config(PRMConfig)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.jsonl").write_text('{"prompt": "q", "steps": ["a"], "outcome": true}\n{"prompt": 1}\n')
    with pytest.raises(ConfigError, match=r"train\.jsonl:2"):
        load_outcomes(bad)


def test_prm_learning_rate_warms_up_linearly_then_holds() -> None:
    config = PRMConfig(learning_rate=1e-3, warmup_steps=4)
    assert [config.learning_rate_at(s) for s in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert PRMConfig(learning_rate=1e-3, warmup_steps=0).learning_rate_at(0) == 1e-3


def test_prm_defaults_are_the_papers_where_it_states_them() -> None:
    """Two-layer MLP head, lr 1e-5 with 1,000 warm-up steps, batch 32: in PRMConfig and in the
    shipped recipe, which must agree."""
    default = PRMConfig()
    shipped = Recipe.load("outcome-prm.yaml").config(PRMConfig)
    for config in (default, shipped):
        assert (config.head, config.learning_rate, config.warmup_steps, config.batch_size) == ("mlp", 1e-5, 1000, 32)
        assert config.weight_decay == 0.0  # Adam
    assert default.learning_rate_at(0) == pytest.approx(1e-8) and default.learning_rate_at(999) == 1e-5


def test_the_scoring_head_is_a_two_layer_mlp_and_linear_stays_an_option(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "base", n_positions=256)
    mlp = StepScorer.from_base(str(model), seed=0)
    layers = [m for m in mlp.head.modules() if isinstance(m, torch.nn.Linear)]
    hidden = mlp.backbone.config.hidden_size
    assert [(m.in_features, m.out_features) for m in layers] == [(hidden, hidden), (hidden, 1)]
    assert any(isinstance(m, torch.nn.ReLU) for m in mlp.head.modules())
    linear = StepScorer.from_base(str(model), seed=0, head="linear")
    assert isinstance(linear.head, torch.nn.Linear) and linear.head.out_features == 1
    solutions = [("Q?", ["Step 1: a.\n\n", "Step 2: b."])]
    for scorer, name in ((mlp, "mlp"), (linear, "linear")):
        torch.nn.init.normal_(next(iter(scorer.head.parameters())))  # a head that is not all zero
        scorer.save(tmp_path / name)
        loaded = StepScorer.load(tmp_path / name)
        assert loaded.meta["head"] == name
        assert loaded.score(solutions)[0] == pytest.approx(scorer.score(solutions)[0])
    with pytest.raises(ConfigError, match="PRM head 'deep'"):
        PRMConfig(head="deep")


def test_gradient_accumulation_takes_the_same_step_as_the_whole_batch(sqlite: Database, tmp_path: Path) -> None:
    """batch 4 in two passes of 2 ends where batch 4 in one pass does (dropout off)."""
    model = build_tiny_model(tmp_path / "base", n_positions=256)
    examples = [
        OutcomeExample(
            f"Q{i}?", tuple(f"Step {k}: {'ok' if (i + k) % 3 else 'bad'}.\n\n" for k in range(1, 3 + i % 2)), i % 2 == 0
        )
        for i in range(8)
    ]
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
        setattr(config, key, 0.0)
    config.save_pretrained(model)
    finals = []
    for accumulation in (1, 2):
        recipe = prm_recipe(model, 2, 2, extra=f"  gradient_accumulation_steps: {accumulation}\n")
        finals.append(
            StepScorer.load(
                train_records(sqlite, "prm", examples, "toy", recipe, tmp_path / f"a{accumulation}").final_model
            )
        )
    for (name, x), (_, y) in zip(
        finals[0].backbone.state_dict().items(), finals[1].backbone.state_dict().items(), strict=True
    ):
        assert torch.allclose(x, y, atol=1e-5), f"{name} differs with accumulation"
    base = StepScorer.from_base(str(model), seed=0)
    assert not torch.allclose(next(iter(base.head.parameters())), next(iter(finals[0].head.parameters())))
    with pytest.raises(ConfigError, match="divide batch_size"):
        PRMConfig(batch_size=4, gradient_accumulation_steps=3)


def test_short_first_curriculum_draws_short_solutions_then_every_solution() -> None:
    lengths = [1, 3, 2, 1, 4, 1, 2, 5, 1, 3]
    config = PRMConfig(batch_size=2, curriculum_steps=5, curriculum_max_solution_steps=1, seed=3)
    order = BatchOrder(lengths, config)
    during = [order.at(s) for s in range(5)]
    assert all(lengths[i] == 1 for b in during for i in b)
    # two batches cover the four one-step solutions, then the next epoch reshuffles them
    assert sorted(during[0] + during[1]) == [0, 3, 5, 8] == sorted(during[2] + during[3])
    after = [i for s in range(5, 10) for i in order.at(s)]
    assert sorted(after) == list(range(10))  # one full epoch, counted from the curriculum's end
    assert order.at(5) == BatchOrder(lengths, PRMConfig(batch_size=2, seed=3)).at(0)
    assert BatchOrder(lengths, config).at(7) == order.at(7)  # a fresh order (a resumed run) agrees
    with pytest.raises(ConfigError, match="curriculum_max_solution_steps positive"):
        PRMConfig(curriculum_steps=1, curriculum_max_solution_steps=0)
    with pytest.raises(ConfigError, match="no solution has at most 1 steps"):
        BatchOrder([2, 3], PRMConfig(curriculum_steps=1))


def _synthetic_processbench(path: Path, n: int, seed: int) -> Path:
    """ProcessBench-format samples of the synthetic policy, labelled by its step truth."""
    from stepq.workers.backends.synthetic_policy import SyntheticPolicy, ground_truth, make_problem

    policy = SyntheticPolicy(error_rate=0.3, recovery_rate=0.0)
    samples = []
    for i in range(n):
        problem = make_problem(seed * 10_000 + i)
        steps = policy.solve(problem, seed * 10_000 + i)
        label = next((k for k, ok in enumerate(ground_truth(steps)) if not ok), -1)
        samples.append(
            {"id": f"{path.stem}-{i}", "problem": problem.question, "steps": [s.text for s in steps], "label": label}
        )
    path.write_text(json.dumps(samples))
    return path


@pytest.mark.integration
def test_eval_commands_use_a_trained_prm(sqlite: Database, tmp_path: Path) -> None:
    """ProcessBench with thresholds chosen on other files than those scored (one for all, or
    one per subset), and Best-of-N picking by the PRM's own scores."""
    from stepq.trainer.evaluation import processbench as pb
    from stepq.trainer.evaluation.best_of_n import AGGREGATORS
    from stepq.trainer.evaluation.judge_spec import JudgeSpec, build_judge

    _set(sqlite)
    examples = [OutcomeExample(e.problem, e.steps, e.outcome) for e in set_outcomes(sqlite, "o")]
    model = build_tiny_model(tmp_path / "base", n_positions=4096)
    result = train_records(
        sqlite, "prm", examples, "outcomes:o", prm_recipe(model, 2, 2), tmp_path / "run", TrainOptions()
    )
    env = clean_env(STEPQ_DATABASE_URL=str(sqlite.engine.url))

    def stepq(*args: str) -> subprocess.CompletedProcess[str]:
        return run_stepq(*args, env=env)

    synth = _synthetic_processbench(tmp_path / "synth.json", 30, 1)
    tune_all = _synthetic_processbench(tmp_path / "tune_all.json", 30, 2)
    tune_synth = _synthetic_processbench(tmp_path / "tune_synth.json", 30, 3)
    judge = build_judge(JudgeSpec(kind="prm", model=str(result.final_model))).judge

    def chosen(path: Path) -> float:
        samples = pb.load_samples(path)
        return pb.choose_threshold(pb.sample_scores(judge, samples), {s["id"]: s["label"] for s in samples})

    prm = ("--judge", "prm", "--model", str(result.final_model))
    done = stepq(
        "eval", "processbench", "--data", str(SAMPLE), str(synth), "--tune-threshold-on", str(tune_all),
        "--tune-subset", f"synth={tune_synth}", *prm, "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    by = {r["subset"]: r for r in report["subsets"]}
    assert by[SAMPLE.stem]["samples"] == len(json.loads(SAMPLE.read_text()))
    assert (by[SAMPLE.stem]["threshold_tuned_on"], by["synth"]["threshold_tuned_on"]) == ("tune_all", "tune_synth")
    assert by[SAMPLE.stem]["threshold"] == pytest.approx(chosen(tune_all))
    assert by["synth"]["threshold"] == pytest.approx(chosen(tune_synth))
    wrong = stepq("eval", "processbench", "--data", str(SAMPLE), "--tune-subset", f"math={tune_synth}", *prm)
    assert wrong.returncode != 0 and "no --data file for subset(s) math" in wrong.stderr
    # the outcome-supervised PRM paper's protocol: each subset at its own best threshold, labelled oracle
    oracle = stepq("eval", "processbench", "--data", str(SAMPLE), str(synth), "--oracle-threshold", *prm, "--json")
    assert oracle.returncode == 0, oracle.stderr
    oracle_report = json.loads(oracle.stdout)
    assert oracle_report["threshold_protocol"] == "oracle" and report["threshold_protocol"] == "per subset"
    for path in (SAMPLE, synth):
        row = next(r for r in oracle_report["subsets"] if r["subset"] == path.stem)
        samples = pb.load_samples(path)
        own = pb.choose_threshold(pb.sample_scores(judge, samples), {s["id"]: s["label"] for s in samples}, 10_000)
        assert (row["threshold_tuned_on"], row["threshold"]) == ("oracle", pytest.approx(own))
        assert row["f1"] >= by[path.stem]["f1"], "the best threshold on the subset itself is at least as good"
    shown = stepq("eval", "processbench", "--data", str(synth), "--oracle-threshold", *prm)
    assert "(oracle: the best F1 on this subset itself" in shown.stdout, shown.stdout
    both = stepq(
        "eval", "processbench", "--data", str(synth), "--oracle-threshold", "--tune-threshold-on", str(synth), *prm
    )
    assert both.returncode == 2 and "oracle threshold is chosen on each subset itself" in both.stderr
    for how in ("geomean", "softmin"):
        bon = stepq("eval", "best-of-n", "--set", "o", "--n", "2", "--aggregate", how, *prm, "--json")
        assert bon.returncode == 0, bon.stderr
        (row,) = json.loads(bon.stdout)["rows"]
        # the pick is the candidate whose aggregated PRM scores are highest: recompute it
        from stepq.models import queries

        with sqlite.session() as session:
            solutions = queries.set_solutions(session, queries.get_set(session, "o").id)
        expected = []
        for trajectories in solutions.values():
            pair = trajectories[:2]
            scores = judge.score_solutions([(t["question"], t["chunks"]) for t in pair])
            values = [AGGREGATORS[how]([0.0 if x is None else x for x in row]) for row in scores]
            expected.append(bool(pair[values.index(max(values))]["outcome"]))
        assert len(expected) == 6 and len(set(map(len, solutions.values()))) == 1
        assert row["judge"] == pytest.approx(100 * sum(expected) / len(expected))
    missing = stepq("eval", "processbench", "--data", str(SAMPLE), "--judge", "prm", "--model", str(tmp_path))
    assert missing.returncode != 0 and "not a stepq PRM" in missing.stderr


def test_prm_finds_the_wrong_step_from_outcome_labels_alone(sqlite: Database, tmp_path: Path) -> None:
    """A flaw the model can see ("bad" in a step) and only the outcome as supervision: the
    trained PRM scores the first wrong step below the right steps before it (untrained, with
    max_steps 1, this fails).  The step-level truth is never shown to it."""
    import random

    rng = random.Random(0)

    def solution(i: int) -> tuple[str, list[str], list[bool]]:
        oks = [rng.random() > 0.25 for _ in range(rng.randint(2, 4))]
        return f"Problem {i}?", [f"Step {k + 1}: {'ok' if ok else 'bad'}.\n\n" for k, ok in enumerate(oks)], oks

    train = [solution(i) for i in range(400)]
    examples = [OutcomeExample(q, tuple(steps), all(oks)) for q, steps, oks in train]
    model = build_tiny_model(tmp_path / "base", n_positions=256)
    recipe = Recipe.parse(
        f"method: prm\nmodel: {model}\ntrainer:\n  aggregate: asymmetric\n  learning_rate: 0.003\n  warmup_steps: 0\n"
        "  batch_size: 16\n  epochs: 20\n  max_steps: 150\n  save_steps: 150\n  logging_steps: 50\n"
    )
    scorer = StepScorer.load(train_records(sqlite, "prm", examples, "toy", recipe, tmp_path / "run").final_model)
    test = [solution(1000 + i) for i in range(200)]
    scores = scorer.score([(q, steps) for q, steps, _ in test])
    first_wrong, right_before = [], []
    for (_, _, oks), row in zip(test, scores, strict=True):
        for ok, score in zip(oks, row, strict=True):
            assert score is not None
            if not ok:
                first_wrong.append(score)
                break
            right_before.append(score)
    pairs = [(w < r) + 0.5 * (w == r) for w in first_wrong for r in right_before]
    assert sum(pairs) / len(pairs) > 0.9, "the first wrong step ranks below the right ones"
