"""Run step searches in a worker: lease a search, replay its stored turns, and write each new
turn under the lease until it finishes.  A crash loses at most the turn in flight; the
search's next holder redoes it with the same seeds.  Thin: the logic is ``step_search``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stepq.models import queries
from stepq.models.errors import ConfigError
from stepq.models.problems import Problem, ProblemSet
from stepq.models.search import FINISH, STEP_SEARCHES, StepSearch
from stepq.workers.backends import GenerationBackend, SamplingParams
from stepq.workers.jobqueue.job_kind import JobKind
from stepq.workers.jobqueue.runner import Claimed, run_jobs
from stepq.workers.jobqueue.runtime import WorkerRuntime
from stepq.workers.search.pairwise import (
    VERDICT_BY,
    ModelPairwiseJudge,
    PairwiseJudge,
    SyntheticPairwiseOracle,
    load_template,
)
from stepq.workers.search.step_search import SearchSpec, candidate_params, next_turn, replay

ORACLE = "synthetic-oracle"
JUDGE_KEYS = ("sampling", "verdict_by", "template")
"""Keys of a judge's config that say how it is asked, not how its backend is built."""


def judge_for(
    make: Callable[[str, dict[str, Any]], GenerationBackend], backend: str, config: dict[str, Any]
) -> PairwiseJudge:
    """The search's pairwise judge: the synthetic oracle, or a model on a backend that ``make``
    builds (a worker's warm one, or a fresh one for an evaluation)."""
    if backend == ORACLE:
        return SyntheticPairwiseOracle()
    engine = make(backend, {k: v for k, v in config.items() if k not in JUDGE_KEYS})
    # stepq's choices (the method states none): greedy answers, up to 1,024 tokens; an answer
    # cut before its verdict counts for neither candidate, and every report counts them
    sampling = {"temperature": 0.0, "max_tokens": 1024, **(config.get("sampling") or {})}
    verdict_by = str(config.get("verdict_by", "text"))
    if verdict_by not in VERDICT_BY:
        raise ConfigError(f"judge verdict_by '{verdict_by}' is not one of: {', '.join(VERDICT_BY)}")
    template = load_template(config.get("template") or "published")
    return ModelPairwiseJudge(engine, SamplingParams.from_config(sampling), template=template, verdict_by=verdict_by)


def handle_searches(rt: WorkerRuntime, claimed: Claimed) -> None:
    """Run each claimed search to its end (or to the process's stop) under its lease."""
    claimed.one_by_one(lambda search_id: _run_search(rt, claimed, search_id))


def _run_search(rt: WorkerRuntime, claimed: Claimed, search_id: int) -> bool:
    """True when the search ended; False when the process is stopping (the runner hands it
    back: a crash or a stop loses at most the turn in flight)."""
    with rt.db.session() as s:
        search = s.get_one(StepSearch, search_id)
        spec, pset, judge_backend, judge_config = _load(s, search)
        policy_model, sampling = search.policy_model, search.sampling
        turns = [(t.action, list(t.candidates), t.chosen) for t in queries.search_turns(s, search_id)]
    if policy_model is None:
        policy = rt.engines.backend_for(pset)
    else:  # a later round's policy: the trained model, on the set's backend
        policy = rt.engines.backend_named(pset.backend, {**(pset.backend_config or {}), "model": policy_model})
    params = candidate_params(pset.sampling, sampling)
    judge = judge_for(rt.engines.backend_named, judge_backend, judge_config)
    prefix, finished = replay(turns)
    turn_no = len(turns)
    while not finished and turn_no < spec.max_turns:
        if claimed.stopping:
            return False
        with rt.deadline(f"step search {search_id} turn {turn_no}"):
            turn = next_turn(spec, turn_no, prefix, policy, params, judge)
        finished = turn.action == FINISH
        outcome = "finished" if finished else ("exhausted" if turn_no + 1 >= spec.max_turns else None)
        with rt.db.session() as s:  # the turn and the lease (renewed, or ended) commit together
            if outcome is None:
                claimed.renew(s, search_id)
            else:
                claimed.finish(s, search_id, outcome=outcome)
            queries.record_turn(s, search_id, {**turn.row(), "worker": rt.name})
        turns.append((turn.action, turn.candidates, turn.chosen))
        prefix, finished = replay(turns)
        turn_no += 1
        if outcome is not None:
            return True
    with rt.db.session() as s:  # nothing left to run when claimed (its turns were all written)
        claimed.finish(s, search_id, outcome="finished" if finished else "exhausted")
    return True


SEARCHES = JobKind(STEP_SEARCHES, "stepq.step_search", handle_searches)
"""One problem's step search, one to a message (a search is a long task); made by ``stepq
search start``, not planned by the dispatcher."""


def run_search(rt: WorkerRuntime, search_id: int, kind: JobKind = SEARCHES) -> str:
    """Run one search to its end under its lease."""
    return run_jobs(rt, kind, [search_id])[search_id]


def _load(s: Any, search: StepSearch) -> tuple[SearchSpec, ProblemSet, str, dict[str, Any]]:
    problem = s.get(Problem, search.problem_id)
    pset = s.get(ProblemSet, search.problem_set_id)
    spec = SearchSpec(
        search.name,
        problem.question,
        search.prompt,
        search.width,
        search.max_turns,
        search.seed,
        segmentation=search.segmentation,
        scoring=search.scoring,
    )
    s.expunge(pset)
    return spec, pset, search.judge_backend, dict(search.judge_config or {})
