"""Step search with a pairwise judge: verdict parsing, order-consistency filtering, scores
and decisions (pure), whole searches on the embedded database with the synthetic oracle, and
through the queue on PostgreSQL + Redis + Celery with a worker SIGKILLed mid-search."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select, text, update

from stepq.assembly import worker_runtime
from stepq.models import Database, Problem
from stepq.models.search import ADVANCE, FINISH, RESAMPLE, ROLLBACK
from stepq.workers.backends.synthetic_policy import step_is_right
from stepq.workers.search.pairwise import (
    Comparison,
    SyntheticPairwiseOracle,
    comparisons,
    decide,
    parse_preference,
    questions_for,
    render,
    score_candidates,
    win_scores,
    winners,
)
from stepq.workers.search.step_search import replay, surviving_pairs
from tests.helpers import Cluster, clean_env, outlets, run_stepq, wait_for


def test_parse_preference_takes_the_last_verdict() -> None:
    assert parse_preference("A looks wrong... so [[B]]") == "B"
    assert parse_preference("[[A]] at first, but on reflection [[ B ]]") == "B"
    assert parse_preference("I prefer A") is None
    assert parse_preference("[[C]]") is None


def test_every_pair_is_asked_in_both_orders() -> None:
    asked = comparisons(4)
    assert len(asked) == 4 * 3
    assert {(c.first, c.second) for c in asked} == {(i, j) for i in range(4) for j in range(4) if i != j}


def test_a_pair_counts_only_when_both_orders_agree() -> None:
    asked = [Comparison(0, 1), Comparison(1, 0), Comparison(0, 2), Comparison(2, 0), Comparison(1, 2), Comparison(2, 1)]
    # (0,1): A then B -> both name 0; (0,2): A then A -> position bias, no decision;
    # (1,2): B then None -> a missing answer, no decision
    result = winners(asked, ["A", "B", "A", "A", "B", None])
    assert result == {(0, 1): 0, (0, 2): None, (1, 2): None}
    assert win_scores(3, result) == [1, 0, 0]
    assert winners(asked[:2], ["B", "A"]) == {(0, 1): 1}


def test_by_default_each_pair_is_asked_once_in_a_seeded_order() -> None:
    straight = questions_for("each-verdict", 4, lambda i, j: False)
    assert [(c.first, c.second) for c in straight] == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    flipped = questions_for("each-verdict", 4, lambda i, j: j == 3)
    assert {(c.first, c.second) for c in flipped} == {(0, 1), (0, 2), (3, 0), (1, 2), (3, 1), (3, 2)}
    assert len(questions_for("both-orders", 4, lambda i, j: False)) == 12
    with pytest.raises(Exception, match="unknown search scoring"):
        questions_for("majority", 4, lambda i, j: False)


def test_each_verdict_scores_a_candidate_by_the_candidates_it_beats() -> None:
    """score_i = sum_{j != i} O(s_i, s_j): every answered comparison gives its winner a point,
    whichever position it was shown in; an answer without a verdict gives none."""
    asked = [Comparison(0, 1), Comparison(2, 0), Comparison(1, 2)]
    assert score_candidates("each-verdict", 3, asked, ["A", "A", None]) == ([1, 0, 1], 2)
    assert score_candidates("each-verdict", 3, asked, ["B", "B", "A"]) == ([1, 2, 0], 3)
    # the stricter option needs both orders to agree: one order each decides nothing
    both = [Comparison(0, 1), Comparison(1, 0)]
    assert score_candidates("both-orders", 2, both, ["A", "A"]) == ([0, 0], 0)
    assert score_candidates("each-verdict", 2, both, ["A", "A"]) == ([1, 1], 2)


def test_a_rollback_discards_the_rolled_back_steps_pair() -> None:
    actions = [ADVANCE, ADVANCE, ROLLBACK, ADVANCE, RESAMPLE, FINISH]
    assert surviving_pairs(actions) == [0, 3, 5], "turn 1's step was rolled back, and its pair with it"
    assert surviving_pairs([ADVANCE, ROLLBACK, ROLLBACK, ADVANCE]) == [3]
    assert surviving_pairs([RESAMPLE, ADVANCE]) == [1]


def test_decide_keeps_the_best_pairs_it_with_the_worst_and_rolls_back_on_ties() -> None:
    d = decide([1, 3, 0, 3])
    assert (d.action, d.best, d.worst) == ("advance", 1, 2), "ties go to the lower index"
    assert decide([2, 2, 2]).action == "rollback"
    assert decide([0, 0]).action == "rollback"


def test_replay_follows_the_turns() -> None:
    turns = [
        (ADVANCE, ["a1", "b1"], 0),
        (ADVANCE, ["a2", "b2"], 1),
        (ROLLBACK, ["x", "y"], None),
        (ADVANCE, ["c2", "d2"], 1),
    ]
    assert replay(turns) == (["a1", "d2"], False)
    assert replay([(RESAMPLE, ["x"], None), (ROLLBACK, ["y"], None)]) == ([], False)
    assert replay([*turns, (FINISH, ["e3", "f3"], 0), (ADVANCE, ["z"], 0)]) == (["a1", "d2", "e3"], True)


def test_the_oracle_prefers_the_right_step_and_is_position_biased_on_ties() -> None:
    q = "Start with 3. Add 4. Multiply by 2. What is the result?"
    right, wrong = "Step 1: 3 + 4 = 7.\n\n", "Step 1: 3 + 4 = 9.\n\n"
    from stepq.workers.search.pairwise import PairQuestion

    oracle = SyntheticPairwiseOracle()
    answers = oracle.prefer([PairQuestion(q, (), right, wrong), PairQuestion(q, (), wrong, right)])
    assert answers == ["A", "B"]
    assert oracle.prefer([PairQuestion(q, (), right, right)]) == ["A"]
    assert "Candidate A:\nx" in render("{problem}{history}Candidate A:\n{a}{b}", q, (), "x", "y")


def _env(url: str) -> dict[str, str]:
    return clean_env(STEPQ_DATABASE_URL=url)


def _stepq(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_stepq(*args, env=env, cwd=cwd)


SEARCH = ("--width", "4", "--max-turns", "30", "--seed", "5")


def _pairs(db: Database) -> list[tuple[str, int, str, str, str]]:
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT p.question, t.turn, t.prefix, t.candidates, t.chosen, t.rejected FROM search_turns t "
                "JOIN step_searches s ON s.id = t.search_id JOIN problems p ON p.id = s.problem_id "
                "WHERE t.chosen IS NOT NULL"
            )
        ).all()
    import json

    out = []
    for question, turn, prefix, cands, chosen, rejected in rows:
        cands = json.loads(cands) if isinstance(cands, str) else cands
        prefix = json.loads(prefix) if isinstance(prefix, str) else prefix
        out.append((question, turn, "".join(prefix), cands[chosen], cands[rejected]))
    return sorted(out)


def test_embedded_step_search_yields_right_over_wrong_pairs(sqlite: Database, tmp_path: Path) -> None:
    """With both-orders scoring the position-biased oracle decides only right-over-wrong; every
    exported pair is one of the steps the search kept in the end, in the policy's context."""
    env = _env(str(sqlite.engine.url))
    assert _stepq(env, tmp_path, "synth", "--set", "s", "--problems", "8", "--error-rate", "0.3").returncode == 0
    started = _stepq(env, tmp_path, "search", "start", "--set", "s", "--name", "n", *SEARCH, "--scoring", "both-orders")
    assert started.returncode == 0 and "8 new searches" in started.stdout, started.stderr
    again = _stepq(env, tmp_path, "search", "start", "--set", "s", "--name", "n", *SEARCH)
    assert "0 new searches" in again.stdout, "starting the same search again adds nothing"
    ran = _stepq(env, tmp_path, "search", "run")
    assert ran.returncode == 0 and "done 8" in ran.stdout, ran.stderr
    pairs = _pairs(sqlite)
    assert pairs, "the searches advanced"
    for question, _, prefix, chosen, rejected in pairs:
        assert step_is_right(question, (prefix,), chosen) is True, "the oracle's consistent winner is right"
        assert step_is_right(question, (prefix,), rejected) is False
    with sqlite.engine.connect() as conn:
        outcomes = dict(conn.execute(text("SELECT outcome, count(*) FROM step_searches GROUP BY outcome")).all())
        actions = dict(conn.execute(text("SELECT action, count(*) FROM search_turns GROUP BY action")).all())
    assert outcomes.get("finished", 0) >= 6 and sum(outcomes.values()) == 8
    assert actions.get(RESAMPLE, 0) + actions.get(ROLLBACK, 0) > 0, "all-right (tied) candidate sets step back"
    out = tmp_path / "pairs"
    exported = _stepq(env, tmp_path, "export", "preferences", "--search", "n", "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    import json

    from stepq.models import queries

    with sqlite.session() as session:
        searches = session.execute(text("SELECT id, prompt FROM step_searches")).all()
        final = {}
        for sid, _ in searches:
            turns = queries.search_turns(session, sid)
            final[sid] = replay([(t.action, list(t.candidates), t.chosen) for t in turns])[0]
    records = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    kept_steps = sum(len(steps) for steps in final.values())
    assert len(records) == kept_steps < len(pairs), "a rolled-back step's pair is not exported"
    assert f"{kept_steps} step preference pairs" in exported.stdout
    prompts = dict(searches)
    for r in records:
        kept = final[r["search_id"]]
        assert r["chosen"] == kept[r["prefix_len"]], "every exported pair's chosen step is one the search kept"
        assert r["prompt"] == prompts[r["search_id"]] + "".join(kept[: r["prefix_len"]]), "the policy's own context"
        assert r["prompt"].startswith("Solve the problem step by step")
    status = _stepq(env, tmp_path, "search", "status", "--json")
    assert f'"pairs": {len(pairs)}' in status.stdout
    bad = _stepq(env, tmp_path, "search", "start", "--set", "nope", "--name", "n")
    assert bad.returncode == 4 and "no problem set" in bad.stderr.lower()


def _running_search(pg: Database, owner: str) -> int:
    with pg.engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM step_searches WHERE state = 'running' AND lease_owner LIKE :o"),
                {"o": f"{owner}@%"},
            ).scalar_one()
        )


@pytest.mark.integration
def test_step_search_through_the_queue_survives_a_sigkill(
    cluster: Cluster, pg: Database, sqlite: Database, tmp_path: Path
) -> None:
    synth = ("synth", "--set", "q", "--problems", "12", "--seed", "2", "--error-rate", "0.3")
    # the reference: the same searches, uninterrupted, in another (embedded) database
    env = _env(str(sqlite.engine.url))
    for args in (synth, ("search", "start", "--set", "q", "--name", "k", *SEARCH), ("search", "run")):
        assert _stepq(env, tmp_path, *args).returncode == 0
    reference = _pairs(sqlite)
    assert len(reference) >= 12

    cluster.cli(*synth, "--latency-s", "0.05")
    cluster.cli("search", "start", "--set", "q", "--name", "k", *SEARCH)
    victim = cluster.start_worker("victim")
    log = (cluster.logs / "dispatcher.log").open("wb")
    cluster.procs.append(
        subprocess.Popen(
            [sys.executable, "-m", "stepq", "dispatch"], env=cluster.env, stdout=log, stderr=subprocess.STDOUT
        )
    )

    def turns() -> int:
        with pg.engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM search_turns")).scalar_one())

    wait_for(lambda: turns() >= 8, 120, "searches under way")

    def holding() -> bool:
        victim.send_signal(signal.SIGSTOP)
        if _running_search(pg, "victim"):
            return True
        victim.send_signal(signal.SIGCONT)
        return False

    wait_for(holding, 60, "the victim to hold a search", interval=0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    cluster.start_worker("rescuer")

    def all_done() -> bool:
        with pg.engine.connect() as conn:
            return not conn.execute(text("SELECT count(*) FROM step_searches WHERE state <> 'done'")).scalar_one()

    wait_for(all_done, 240, "every search done after the kill")
    assert _pairs(pg) == reference, "no pair missing, none duplicated, the same pairs as without the kill"
    with pg.engine.connect() as conn:
        retried = conn.execute(text("SELECT count(*) FROM step_searches WHERE attempts > 1")).scalar_one()
        by_worker = dict(
            conn.execute(text("SELECT split_part(worker, '@', 1), count(*) FROM search_turns GROUP BY 1")).all()
        )
    assert retried >= 1, "the killed worker's search was taken over after its lease expired"
    assert by_worker.get("victim", 0) > 0 and by_worker.get("rescuer", 0) > 0


def test_a_failing_search_gives_up_after_max_attempts_and_a_hand_back_costs_none(sqlite: Database) -> None:
    from stepq.models.search import StepSearch
    from stepq.workers.data.synthetic_set import synth_set
    from stepq.workers.search.plan import SearchPlan, start_search

    synth_set(sqlite, "f", problems=1, seed=1)
    assert start_search(sqlite, SearchPlan("f", "n")) == 1
    assert start_search(sqlite, SearchPlan("f", "n")) == 0

    def state() -> tuple[str, int]:
        with sqlite.session() as s:
            row = s.scalars(select(StepSearch)).one()
            return row.state, row.attempts

    from stepq.models import jobs
    from stepq.models.search import STEP_SEARCHES
    from stepq.workers.jobqueue.job_kind import RetryPolicy

    with sqlite.session() as s:
        (sid,) = jobs.mark_queued(s, STEP_SEARCHES, jobs.pending_ids(s, STEP_SEARCHES, 10), 0.0)
    policy = RetryPolicy(max_attempts=2, backoff_s=0.0)
    for attempt in (1, 2):
        with sqlite.session() as s:
            assert jobs.claim(s, STEP_SEARCHES, sid, "w", 60)
        with sqlite.session() as s:
            outcome = jobs.fail_or_retry(s, STEP_SEARCHES, sid, "w", "timeout", policy.decide)
        assert outcome == ("retry" if attempt == 1 else "failed")
        assert state() == (("pending", 1) if attempt == 1 else ("failed", 2))
    with sqlite.session() as s:
        s.execute(update(StepSearch).values(state="pending", attempts=0))
    with sqlite.session() as s:
        assert jobs.claim(s, STEP_SEARCHES, sid, "w", 60)
    with sqlite.session() as s:
        assert jobs.hand_back(s, STEP_SEARCHES, sid, "w")
    assert state() == ("pending", 0), "a stopping worker's hand-back is not an attempt"


def test_render_never_substitutes_inside_the_text_it_inserts() -> None:
    """LaTeX holds the placeholders' spellings: ``\\frac{a}{b}`` in the problem, the history
    or a candidate must reach the judge as written (a chained replace made it
    ``\\fracCAND_ACAND_B``)."""
    from stepq.workers.search.pairwise import load_template

    frac = "\\frac{a}{b}"
    problem = f"Simplify {frac} when a = 2 and b = 4, and say {{problem}} or {{history}}."
    history = (f"Step 1: {frac} = a/b.\n",)
    shown = render(load_template(), problem, history, f"Step 2: {frac} = 1/2.", "Step 2: {b} over {a}.")
    assert problem in shown
    assert history[0].strip() in shown
    assert f"Candidate A:\nStep 2: {frac} = 1/2." in shown
    assert "Candidate B:\nStep 2: {b} over {a}." in shown
    assert shown.count(frac) == 3 and "CAND" not in shown


def _step_lines_set(db: Database, problems: int = 6) -> None:
    from stepq.workers.data.synthetic_set import synth_set

    # one line a step, as a policy asked for "Step n:" lines writes: no blank line between steps
    synth_set(db, "lines", problems=problems, seed=3, error_rate=0.3, step_separator="\n")


def test_a_search_takes_one_turn_per_step_of_the_policy(sqlite: Database) -> None:
    """Candidates are cut with the set's own segmentation ("Step n:" markers here), so a
    search takes one turn per step and every pair is one step against another: cut at the
    first blank line, every candidate would be the whole rest of the solution."""
    from stepq.assembly import worker_runtime
    from stepq.models import queries
    from stepq.models.search import StepSearch
    from stepq.workers.backends.synthetic_policy import parse_problem
    from stepq.workers.in_process import run_searches_here
    from stepq.workers.jobqueue.runtime import WorkerOptions
    from stepq.workers.search.plan import SearchPlan, start_search

    _step_lines_set(sqlite)
    assert start_search(sqlite, SearchPlan("lines", "n", width=4)) == 6
    rt = worker_runtime(sqlite, WorkerOptions(name="t"))
    try:
        assert run_searches_here(sqlite, rt) == {"done": 6}
    finally:
        rt.close()
    lengths = set()
    with sqlite.session() as s:
        for search in s.scalars(select(StepSearch)):
            assert search.segmentation == "step-markers" and search.outcome == "finished"
            steps = len(parse_problem(search.prompt).ops)
            lengths.add(steps)
            turns = queries.search_turns(s, search.id)
            # each-verdict over 4 candidates never ties all four: no rollback, one turn a step
            assert [t.action for t in turns] == [ADVANCE] * (steps - 1) + [FINISH]
            for t in turns:
                for c in t.candidates:
                    assert c.count("Step ") == 1, f"a candidate is one step, not {c!r}"
            kept = replay([(t.action, list(t.candidates), t.chosen) for t in turns])[0]
            assert [int(k.split(":")[0].split()[1]) for k in kept] == list(range(1, steps + 1))
    assert 4 in lengths, "the set holds a 4-step problem, searched in 4 turns"


def test_a_search_samples_as_the_method_does_and_records_it(sqlite: Database) -> None:
    """T = 0.5 and top_p = 0.95 unless the search asks otherwise, over the set's own sampling
    (its max tokens stay); the search's prompt is the one the set's trajectories saw."""
    from stepq.models.search import StepSearch
    from stepq.models.trajectories import Trajectory
    from stepq.workers.backends import SamplingParams
    from stepq.workers.backends.synthetic import SyntheticBackend
    from stepq.workers.in_process import run_searches_here
    from stepq.workers.jobqueue.runtime import WorkerOptions
    from stepq.workers.search.plan import SearchPlan, start_search

    _step_lines_set(sqlite, problems=2)
    with sqlite.session() as s:
        s.execute(text("UPDATE problem_sets SET sampling = :s"), {"s": '{"max_tokens": 77, "temperature": 1.0}'})
    start_search(sqlite, SearchPlan("lines", "paper", width=2, max_turns=1))
    start_search(sqlite, SearchPlan("lines", "hot", width=2, max_turns=1, sampling={"temperature": 0.9, "top_p": 1.0}))

    seen: list[SamplingParams] = []

    class Recording(SyntheticBackend):
        def generate(self, requests, params):  # type: ignore[no-untyped-def]
            seen.append(params)
            return super().generate(requests, params)

    rt = worker_runtime(sqlite, WorkerOptions(name="t"), backend=Recording(step_separator="\n"))
    try:
        run_searches_here(sqlite, rt)
    finally:
        rt.close()
    assert {(p.temperature, p.top_p, p.max_tokens) for p in seen} == {(0.5, 0.95, 77), (0.9, 1.0, 77)}
    with sqlite.session() as s:
        prompts = {t.problem_id: t.prompt for t in s.scalars(select(Trajectory))}
        for search in s.scalars(select(StepSearch)):
            assert search.prompt == prompts[search.problem_id]


def test_a_search_defaults_to_the_methods_settings() -> None:
    """Width 6, at most 20 turns, each verdict counted: in the plan and on the command line."""
    from click.testing import CliRunner

    from stepq.cli import main
    from stepq.workers.search.plan import SearchPlan

    plan = SearchPlan("s", "n")
    assert (plan.width, plan.max_turns, plan.scoring) == (6, 20, "each-verdict")
    assert plan.sampling == {"temperature": 0.5, "top_p": 0.95}
    shown = CliRunner().invoke(main, ["search", "start", "--help"]).output
    assert "--temperature FLOAT RANGE" in shown and "[default: 0.5;" in " ".join(shown.split())
    assert "[default: 0.95;" in " ".join(shown.split())
    assert "--max-turns INTEGER RANGE" in shown and "[default: 20;" in " ".join(shown.split())
    assert "[default: each-verdict]" in " ".join(shown.split())


def test_searches_share_the_brokers_bound_with_rollout_work(sqlite: Database) -> None:
    """300 pending searches and no worker: one cycle publishes no more than the bound (2
    messages per live worker, at least 2), and queued rollout work counts against it too.
    A search whose message is lost is published again once the queue is seen empty."""
    from stepq.workers.data.synthetic_set import synth_set
    from stepq.workers.jobqueue.dispatcher import Dispatcher, DispatchOptions
    from stepq.workers.search.plan import SearchPlan, start_search

    synth_set(sqlite, "b", problems=300, seed=1)
    assert start_search(sqlite, SearchPlan("b", "n")) == 300
    searches: list[int] = []
    items: list[int] = []
    options = DispatchOptions(messages_per_worker=2, min_messages=2, requeue_after_s=60.0)
    depth = [3]
    dispatcher = Dispatcher(
        sqlite, outlets(items.extend, searches.extend), options=options, queue_depth=lambda: depth[0]
    )
    dispatcher.cycle()
    assert len(searches) == 2, "the bound: 2 messages with no live worker"
    dispatcher.cycle()
    assert len(searches) == 2, "nothing more while those two are queued"
    with sqlite.engine.begin() as conn:  # published long ago, never delivered: lost
        conn.execute(text("UPDATE step_searches SET enqueued_at = enqueued_at - 3600 WHERE state = 'queued'"))
    dispatcher.cycle()
    assert len(searches) == 2, "while the queue holds messages, any of them may still be waiting"
    depth[0] = 0  # the broker lost them
    dispatcher.cycle()
    assert len(searches) == 4 and sorted(searches[2:]) == sorted(searches[:2]), "republished, once"
    from stepq.workers.annotation_plans import configure_annotation

    configure_annotation(sqlite, "b", 2)  # 300 rollout items pending now, the bound already full
    dispatcher.cycle()
    assert items == [], "queued searches count against the one bound"


def test_a_search_on_problems_its_set_cannot_continue_is_refused_at_start(tmp_path: Path) -> None:
    """Ingested problems whose set still samples with the synthetic policy: refused when the
    search is started (exit 2), not as an internal error once it runs."""
    env = _env(f"sqlite:///{tmp_path / 's.db'}")
    problems = tmp_path / "p.jsonl"
    problems.write_text('{"question": "What is 2 + 2?", "answer": "4"}\n')
    assert _stepq(env, tmp_path, "ingest", str(problems), "--set", "g").returncode == 0
    started = _stepq(
        env,
        tmp_path,
        "search",
        "start",
        "--set",
        "g",
        "--name",
        "n",
        "--judge-backend",
        "hf",
        "--judge-model",
        str(tmp_path),
    )
    assert started.returncode == 2 and "synthetic backend cannot continue" in started.stderr, started.stderr


def test_a_search_without_trajectories_applies_the_models_chat_template(sqlite: Database, tmp_path: Path) -> None:
    """No trajectory to take the policy's prompt from: the template, rendered, then the policy
    model's chat template, as 'stepq generate' prompts it; cut at the template's "Step n:"."""
    from transformers import AutoTokenizer

    from stepq.models import queries
    from stepq.models.search import StepSearch
    from stepq.trainer.tiny_model import build_tiny_llama
    from stepq.workers.data.prompts import STEP_TEMPLATE
    from stepq.workers.data.prompts import render as render_prompt
    from stepq.workers.search.plan import SearchPlan, start_search

    model = build_tiny_llama(tmp_path / "m")
    with sqlite.session() as s:
        pset = queries.ensure_set(s, "g", backend="hf", backend_config={"model": str(model)})
        s.add(Problem(problem_set_id=pset.id, external_id="p1", question="What is 2 + 2?", reference_answer="4"))
    judge = {"model": str(model)}
    assert start_search(sqlite, SearchPlan("g", "n", judge_backend="hf", judge_config=judge)) == 1
    tokenizer = AutoTokenizer.from_pretrained(model)
    user = render_prompt(STEP_TEMPLATE, "What is 2 + 2?")
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
    )
    with sqlite.session() as s:
        search = s.scalars(select(StepSearch)).one()
        assert search.prompt == expected and search.prompt != user
        assert search.segmentation == "step-markers"


def test_the_judges_prompt_carries_every_element_of_the_methods_and_brief_is_named() -> None:
    """The method's judge prompt casts the judge as impartial, asks for a detailed explanation
    before the verdict and tells it that neither the order nor the names of the two answers may
    sway it; the default carries each, and brevity is stepq's named option."""
    from stepq.workers.search.pairwise import TEMPLATES, load_template
    from stepq.workers.search.search_handler import judge_for

    published = " ".join(load_template().split()).lower()
    for element in ("impartial judge", "detailed explanation", "order in which", "names", "length", "[[a]]", "[[b]]"):
        assert element in published, element
    assert "brief" not in published
    brief = " ".join(load_template("brief").split()).lower()
    assert "briefly" in brief and "detailed" not in brief
    assert set(TEMPLATES) == {"published", "brief"}

    class Engine:  # a stand-in backend: judge_for only keeps it
        name = generator = "engine"

    made = judge_for(lambda _b, _c: Engine(), "hf", {"model": "m", "template": "brief"})  # type: ignore[arg-type,return-value]
    assert made.template == load_template("brief")  # type: ignore[attr-defined]
    default = judge_for(lambda _b, _c: Engine(), "hf", {"model": "m"})  # type: ignore[arg-type,return-value]
    assert default.template == load_template() and default.params.temperature == 0  # type: ignore[attr-defined]
    assert default.params.max_tokens == 1024  # type: ignore[attr-defined]


def test_an_llm_segmented_set_is_cut_as_its_chunks_were_or_refused(sqlite: Database) -> None:
    """A set whose chunks an LLM drew: its searches cut candidates with the splitter that gives
    back those chunks ("Step n" lines here), not at the first blank line (whole solutions);
    where no splitter does, the search and chunk-reset are refused, saying why."""
    from stepq.models.errors import ConfigError
    from stepq.models.search import StepSearch
    from stepq.trainer.evaluation.validation import _policy_problems
    from stepq.workers.search.plan import SearchPlan, start_search

    _step_lines_set(sqlite)
    with sqlite.engine.begin() as conn:
        conn.execute(text("UPDATE trajectories SET segmentation = 'llm'"))
    assert start_search(sqlite, SearchPlan("lines", "n", width=4)) == 6
    with sqlite.session() as s:
        assert {x.segmentation for x in s.scalars(select(StepSearch))} == {"step-markers"}
    assert {p.segmentation for p in _policy_problems(sqlite, "lines")[1]} == {"step-markers"}
    with sqlite.engine.begin() as conn:  # the LLM drew two steps as one chunk: no splitter does that
        tid, first, second = conn.execute(
            text(
                "SELECT c1.trajectory_id, c1.text, c2.text FROM chunks c1 JOIN chunks c2 "
                "ON c2.trajectory_id = c1.trajectory_id AND c2.idx = 2 WHERE c1.idx = 1 ORDER BY c1.trajectory_id"
            )
        ).first()
        conn.execute(text("DELETE FROM chunks WHERE trajectory_id = :t AND idx = 2"), {"t": tid})
        conn.execute(
            text("UPDATE chunks SET text = :x WHERE trajectory_id = :t AND idx = 1"), {"x": first + second, "t": tid}
        )
    with pytest.raises(ConfigError, match="cut by 'llm', and no splitter"):
        start_search(sqlite, SearchPlan("lines", "m", width=4))
    with pytest.raises(ConfigError, match="stepq segment --set lines"):
        _policy_problems(sqlite, "lines")


def test_a_method_without_a_splitter_is_never_cut_at_a_blank_line() -> None:
    from stepq.models.errors import ConfigError
    from stepq.workers.data.segmentation import SegmentationError, cutting_method, next_chunk

    steps = [["Step 1: 2 + 3 = 5\n", "Step 2: 5 * 2 = 10\n"], ["Step 1: 1 + 1 = 2\n", "Step 2: \\boxed{2}"]]
    assert cutting_method("llm", steps, "s") == "step-markers"
    assert cutting_method("given", [["a" * 400 + "\n\n", "b" * 400]], "s") == "blank-lines"
    assert cutting_method("llm-fallback:blank-lines", [], "s") == "blank-lines"
    assert cutting_method("step-markers", [], "s") == "step-markers" and cutting_method(None, [], "s") is None
    with pytest.raises(ConfigError, match="no splitter"):  # two steps in one chunk, then one: none cuts so
        cutting_method("llm", [["Step 1: a\n\nStep 2: b\n\n", "Step 3: c"]], "s")
    with pytest.raises(SegmentationError, match="no splitter for 'llm'"):
        next_chunk("Step 1: x\n\nStep 2: y", "llm")


def test_search_run_with_failed_searches_exits_7_naming_the_error(tmp_path: Path) -> None:
    """Every search of a run failed (a tiny judge whose prompt outgrew its positions) and
    'stepq search run' exited 0: the pairs were missing without a word."""
    env = clean_env(STEPQ_DATABASE_URL=f"sqlite:///{tmp_path / 's.db'}", STEPQ_MAX_ATTEMPTS="1")
    assert run_stepq("synth", "--set", "s", "--problems", "2", env=env, cwd=tmp_path).returncode == 0
    started = run_stepq(
        "search", "start", "--set", "s", "--name", "x", "--judge-backend", "openai", "--judge-model", "m",
        "--judge-base-url", "http://127.0.0.1:1/v1", env=env, cwd=tmp_path,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    ran = run_stepq("search", "run", env=env, cwd=tmp_path)
    assert ran.returncode == 7, (ran.stdout, ran.stderr)
    assert "2 step searches failed (latest error: " in ran.stderr and "connection refused" in ran.stderr
