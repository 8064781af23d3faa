"""Pure twins of the fidelity checks that otherwise run only with a database, so that the
one-minute tier (``pytest -m unit``) fails on each of the review's mutations: the search's
segmentation, the candidates' sampling precedence, the Q-pair's texts, the pass rate's
arithmetic and bounds.  (The oracle threshold's: tests/test_processbench_thresholds.py; the
list of mutations and how to run them: scripts/mutations.py.)"""

from __future__ import annotations

from stepq.trainer.outcomes.export import problems_in_pass_rate
from stepq.trainer.preferences.export import pair_record
from stepq.trainer.preferences.pairs import ScoredTrajectory, q_pairs
from stepq.workers.backends.synthetic import SyntheticBackend
from stepq.workers.backends.synthetic_policy import PROMPT_TEMPLATE, make_problem
from stepq.workers.search.pairwise import SyntheticPairwiseOracle
from stepq.workers.search.step_search import SearchSpec, candidate_params, next_turn


def test_a_turns_candidates_are_cut_with_the_searchs_segmentation() -> None:
    """A "Step n" policy writing one line a step: cut with step-markers, every candidate is one
    step; cut at the first blank line it would be the whole rest of the solution."""
    question = make_problem(7, min_steps=4, max_steps=4).question
    prompt = PROMPT_TEMPLATE.format(question=question)
    policy = SyntheticBackend(error_rate=0.3, recovery_rate=0.0, step_separator="\n")
    spec = SearchSpec("s", question, prompt, width=4, max_turns=8, seed=1, segmentation="step-markers")
    turn = next_turn(spec, 0, [], policy, candidate_params(None, None), SyntheticPairwiseOracle())
    assert all(c.count("Step ") == 1 and c.startswith("Step 1") for c in turn.candidates), turn.candidates
    whole = next_turn(
        SearchSpec("s", question, prompt, 4, 8, 1, segmentation=None),
        0,
        [],
        policy,
        candidate_params(None, None),
        SyntheticPairwiseOracle(),
    )
    assert all(c.count("Step ") == 4 for c in whole.candidates), "the control: a blank-line cut takes it all"


def test_the_candidates_sampling_is_the_searchs_over_the_sets_own() -> None:
    params = candidate_params(
        {"temperature": 1.0, "top_p": 1.0, "max_tokens": 77, "stop": ["X"]}, {"temperature": 0.5, "top_p": 0.95}
    )
    assert (params.temperature, params.top_p, params.max_tokens, params.stop) == (0.5, 0.95, 77, ("X",))


def test_a_q_pair_record_chooses_the_step_with_the_higher_q() -> None:
    shared = ("Step 1: 2 + 3 = 5\n",)
    good = ScoredTrajectory(1, "p", "Q", (*shared, "Step 2: 5 * 2 = 10\n"), (0.5, 0.5, 0.9), "P:")
    bad = ScoredTrajectory(2, "p", "Q", (*shared, "Step 2: 5 * 2 = 11\n"), (0.5, 0.5, 0.1), "P:")
    (record,) = [pair_record(p) for p in q_pairs([bad, good], margin=0.5)]
    assert record["chosen"] == "Step 2: 5 * 2 = 10\n" and record["rejected"] == "Step 2: 5 * 2 = 11\n"
    assert (record["q_chosen"], record["q_rejected"]) == (0.9, 0.1)
    assert record["prompt"] == "P:Step 1: 2 + 3 = 5\n" and record["prefix_len"] == 1


def test_the_pass_rate_counts_graded_responses_and_keeps_its_bounds() -> None:
    """Right responses over graded ones (trajectory and rollouts from the problem alone), both
    bounds inclusive, an unparseable trajectory counted in neither."""
    cases = {  # problem: (trajectory outcome, rollouts right, rollouts graded) -> rate
        "at-lo": (True, 0, 4),  # 1/5 = 0.2
        "at-hi": (True, 3, 4),  # 4/5 = 0.8
        "mid": (False, 2, 4),  # 2/5
        "none": (False, 0, 4),  # 0/5
        "all": (True, 4, 4),  # 5/5
        "unparsed": (None, 4, 4),  # 4/4, not 4/5
    }
    trajectories = [{"id": i, "problem_id": name} for i, name in enumerate(cases)]
    outcomes = {i: c[0] for i, c in enumerate(cases.values())}
    counts = {i: (c[1], c[2]) for i, c in enumerate(cases.values())}
    kept = problems_in_pass_rate(trajectories, outcomes, counts, (0.2, 0.8))
    assert kept == {"at-lo", "at-hi", "mid"}


def test_best_of_n_ranks_by_the_aggregate_a_prm_was_trained_with() -> None:
    """An ORM (``aggregate: last``) is evaluated by its outcome score, as it was trained; the
    asymmetric PRM predicts with min; a judge with no training aggregate by min."""
    from types import SimpleNamespace

    from stepq.trainer.evaluation.best_of_n import trained_aggregate

    def prm(aggregate: str | None) -> SimpleNamespace:
        return SimpleNamespace(scorer=SimpleNamespace(meta={} if aggregate is None else {"aggregate": aggregate}))

    assert trained_aggregate(prm("last")) == ("last", "the PRM's training aggregate (last)")
    assert trained_aggregate(prm("asymmetric"))[0] == "min"
    assert trained_aggregate(prm("geomean"))[0] == "geomean" and trained_aggregate(prm("softmin"))[0] == "softmin"
    assert trained_aggregate(prm(None)) == ("min", "default")
    assert trained_aggregate(SimpleNamespace()) == ("min", "default")


def test_a_dpo_pair_that_does_not_fit_is_left_out_never_cut() -> None:
    """TRL cuts a long prompt from one end (``keep_end`` lost the problem); a pair that does
    not fit is left out and counted instead, so every pair trains in its own context."""
    from stepq.trainer.preferences.pair_files import pairs_that_fit

    def chars(text: str) -> int:  # a stand-in tokenizer: a token a character
        return len(text)

    short = {"prompt": "P" * 10, "chosen": "c" * 5, "rejected": "r" * 8}
    long = {"prompt": "P" * 10, "chosen": "c" * 5, "rejected": "r" * 30}
    kept, dropped = pairs_that_fit([short, long], chars, max_length=19)
    assert kept == [short] and dropped == 1, "10 + the longer step (8) + end of sequence = 19 fits; 41 does not"
    assert pairs_that_fit([short], chars, max_length=18) == ([], 1)
    assert pairs_that_fit([short, long], chars, None) == ([short, long], 0)
