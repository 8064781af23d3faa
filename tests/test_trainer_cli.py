"""The trainer's commands end to end on the embedded database: snapshot create/list/show/
export and the evaluation commands with the oracle judge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from stepq.cli import main
from stepq.models import Database, queries
from stepq.workers.data.synthetic_set import synth_set
from tests.helpers import annotated_set


def _run(monkeypatch: pytest.MonkeyPatch, db: Database, *args: str) -> str:
    monkeypatch.setenv("STEPQ_DATABASE_URL", db.url)
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_snapshot_commands(sqlite: Database, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    annotated_set(sqlite, problems=25, error_rate=0.25, recovery_rate=0.0)
    out = _run(monkeypatch, sqlite, "snapshot", "create", "--sets", "s", "--rule", "abs-q", "--val-fraction", "0.2")
    assert "snapshot 1 'snapshot-1'" in out
    listed = json.loads(_run(monkeypatch, sqlite, "snapshot", "list", "--json"))
    assert listed[0]["train_positive"] == listed[0]["train_negative"] > 0
    manifest = json.loads(_run(monkeypatch, sqlite, "snapshot", "show", "1"))
    assert manifest["counts"]["train"]["positive"] == listed[0]["train_positive"]
    _run(monkeypatch, sqlite, "snapshot", "export", "1", "--format", "jsonl", "--out", str(tmp_path / "x"))
    lines = (tmp_path / "x" / "train.jsonl").read_text().splitlines()
    assert len(lines) == listed[0]["train_positive"] * 2
    monkeypatch.setenv("STEPQ_DATABASE_URL", sqlite.url)
    again = CliRunner().invoke(main, ["snapshot", "create", "--sets", "s", "--rule", "abs-q", "--name", "snapshot-1"])
    assert again.exit_code == 2 and "immutable" in again.output
    missing = CliRunner().invoke(main, ["snapshot", "show", "99"])
    assert missing.exit_code == 4

    # deleting: confirmed, refused while a run names it unless told, the run's row kept
    held = CliRunner().invoke(main, ["set", "delete", "s", "--yes"])
    assert held.exit_code == 2 and "delete those snapshots first" in held.output
    with sqlite.session() as s:
        run_id = queries.create_run(
            s, snapshot_id=1, method="grpo", recipe="x", base_model="m", output_dir=str(tmp_path / "r"), host="h"
        )
    unconfirmed = CliRunner().invoke(main, ["snapshot", "delete", "1"])
    assert unconfirmed.exit_code == 2 and "--yes" in unconfirmed.output
    refused = CliRunner().invoke(main, ["snapshot", "delete", "1", "--yes"])
    assert refused.exit_code == 2 and f"training run(s) {run_id}" in refused.output
    deleted = CliRunner().invoke(main, ["snapshot", "delete", "snapshot-1", "--yes", "--trained"])
    assert deleted.exit_code == 0, deleted.output
    assert f"{2 * listed[0]['train_positive'] + listed[0]['validation_positive'] * 2} rows" in deleted.output
    with sqlite.session() as s:
        run = queries.get_run(s, run_id)
        assert run.snapshot_id is None and run.dataset == "snapshot 1 (snapshot-1, deleted)"
        assert queries.snapshot_summaries(s) == []
    assert CliRunner().invoke(main, ["snapshot", "show", "1"]).exit_code == 4
    assert CliRunner().invoke(main, ["set", "delete", "s", "--yes"]).exit_code == 0, "nothing holds the set now"


def test_eval_commands_with_the_oracle(sqlite: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    annotated_set(sqlite, problems=25, error_rate=0.25, recovery_rate=0.0)
    _run(monkeypatch, sqlite, "snapshot", "create", "--sets", "s", "--rule", "abs-q", "--val-fraction", "0.3")
    report = json.loads(_run(monkeypatch, sqlite, "eval", "snapshot", "1", "--judge", "oracle", "--json"))
    # Abs-Q labels at M = 8 agree with the truth on nearly every chunk; the oracle is the truth
    assert report["rows"] > 0 and report["balanced_accuracy"] >= 80
    synth_set(sqlite, "bon", problems=30, seed=4, trajectories_per_problem=4, error_rate=0.3, recovery_rate=0.0)
    report = json.loads(
        _run(monkeypatch, sqlite, "eval", "best-of-n", "--set", "bon", "--n", "1,4", "--judge", "oracle", "--json")
    )
    rows = report["rows"]
    assert report["judge"] == "oracle" and report["judge_outputs"] == 0  # an oracle writes no text
    by_n = {r["n"]: r for r in rows}
    assert by_n[1]["judge"] == by_n[1]["random"]
    assert by_n[4]["judge"] > by_n[4]["random"]
    cr = json.loads(_run(monkeypatch, sqlite, "eval", "chunk-reset", "--set", "bon", "--judge", "oracle", "--json"))
    assert cr["chunk_reset"]["accuracy"] > cr["plain"]["accuracy"]
    assert cr["chunk_reset"]["rejected_chunks"] > 0 == cr["plain"]["rejected_chunks"]


def test_eval_step_search_keeps_the_judges_pick_each_step(sqlite: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """Test-time scaling by step search (process-based self-rewarding): with a judge that
    prefers right steps the search beats the policy alone on the same sampling, at the cost of
    width candidates a step; with a judge that cannot tell steps apart it does no better."""
    from stepq.trainer.evaluation.step_search_eval import search_at_test_time
    from stepq.trainer.evaluation.validation import _policy_problems
    from stepq.workers.backends import SamplingParams
    from stepq.workers.backends.synthetic import SyntheticBackend
    from stepq.workers.backends.synthetic_policy import parse_problem
    from stepq.workers.search.pairwise import PairQuestion

    synth_set(sqlite, "tts", problems=40, seed=5, error_rate=0.25, recovery_rate=0.0, step_separator="\n")
    report = json.loads(_run(monkeypatch, sqlite, "eval", "step-search", "--set", "tts", "--width", "4", "--json"))
    alone, search = report["policy_alone"], report["step_search"]
    assert report["sampling"] == {"temperature": 0.5, "top_p": 0.95}
    assert search["accuracy"] == 100.0 > alone["accuracy"] + 20
    assert search["tokens"] > 3 * alone["tokens"], "every step draws width candidates"
    _, problems = _policy_problems(sqlite, "tts")
    # each-verdict over 4 candidates never ties all four: one turn a step of each problem
    assert search["turns"] == sum(len(parse_problem(p.prompt).ops) for p in problems)
    assert search["turns_without_a_pick"] == search["completed_after_max_turns"] == 0

    class Indifferent:
        name = "indifferent"

        def prefer(self, questions: list[PairQuestion]) -> list[str | None]:
            return [None] * len(questions)  # no verdict: every candidate ties, every turn steps back

    backend = SyntheticBackend(error_rate=0.25, recovery_rate=0.0, step_separator="\n")
    blind = search_at_test_time(backend, SamplingParams(), Indifferent(), problems[:5], width=3, max_turns=4)
    assert blind["step_search"]["turns_without_a_pick"] == blind["step_search"]["turns"] == 20
    assert blind["step_search"]["completed_after_max_turns"] == 5, "out of turns, the policy completes the rest"
    assert blind["step_search"]["answers_without_a_verdict"] == 20 * 3, "3 questions a turn, none answered"
    assert report["baseline"] == "greedy" and "ignores the temperature" in report["note"]


def test_step_search_compares_with_greedy_decoding_unless_told() -> None:
    """The method's test-time comparison is against greedy decoding: a sampled draw is weaker
    as a rule, so a search measured against it reads a larger gain than the paper's."""
    from stepq.trainer.evaluation.chunk_reset import PolicyProblem
    from stepq.trainer.evaluation.step_search_eval import search_at_test_time
    from stepq.workers.backends import SamplingParams
    from stepq.workers.backends.base import Completion
    from stepq.workers.search.pairwise import SyntheticPairwiseOracle

    class RecordingPolicy:  # a stand-in policy that records the sampling each call asked for
        name = generator = "recording"

        def __init__(self) -> None:
            self.calls: list[SamplingParams] = []

        def generate(self, requests, params):  # type: ignore[no-untyped-def]
            self.calls.append(params)
            return [[Completion("The answer is 1.", 4)] * len(r.seeds) for r in requests]

        def close(self) -> None:
            return None

    problems = [PolicyProblem("q", "q\n", "1", None)]
    candidates = SamplingParams(temperature=0.5, top_p=0.95)
    for baseline, expected in ((None, (0.0, 1.0)), ("greedy", (0.0, 1.0)), ("sampled", (0.5, 0.95))):
        policy = RecordingPolicy()
        told = {"baseline": baseline} if baseline else {}
        out = search_at_test_time(policy, candidates, SyntheticPairwiseOracle(), problems, width=2, **told)
        first, *search = policy.calls
        assert (first.temperature, first.top_p) == expected and out["baseline"] == (baseline or "greedy")
        assert out["policy_alone"]["sampling"] == dict(zip(("temperature", "top_p"), expected, strict=True))
        assert search and all((p.temperature, p.top_p) == (0.5, 0.95) for p in search), "candidates as the method"


def test_best_of_n_reports_every_n_asked(sqlite: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """An N the set cannot fill still gets its line, saying why, instead of vanishing (a set
    of one trajectory per problem printed N = 1 alone)."""
    synth_set(sqlite, "one", problems=6, seed=2)
    out = _run(monkeypatch, sqlite, "eval", "best-of-n", "--set", "one", "--n", "4,1,2", "--judge", "oracle")
    assert out.splitlines()[0] == "aggregate: min (default); pick: best"
    lines = [line.split() for line in out.splitlines()[1:]]
    assert [row[0] for row in lines[1:4]] == ["1", "2", "4"]
    assert lines[1][4] == "6" and "(no problem has 2 trajectories)" in out and "(no problem has 4" in out
    assert "stepq generate --set one --samples 4" in out
    rows = json.loads(
        _run(monkeypatch, sqlite, "eval", "best-of-n", "--set", "one", "--n", "1,4", "--judge", "oracle", "--json")
    )["rows"]
    assert [(r["n"], r["problems"], r["judge"] is None) for r in rows] == [(1, 6, False), (4, 0, True)]
    voted = json.loads(
        _run(monkeypatch, sqlite, "eval", "best-of-n", "--set", "one", "--n", "1", "--judge", "oracle", "--json",
             "--pick", "weighted-vote")
    )  # fmt: skip
    # one sample a problem: its answer is the only one, so the vote is that sample, as majority's
    assert voted["choose"] == "weighted-vote" and voted["rows"][0]["judge"] == voted["rows"][0]["majority"]
