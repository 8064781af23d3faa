"""Run step searches in a worker: lease a search, replay its stored turns, and write each new
turn under the lease until it finishes.  A crash loses at most the turn in flight; the
search's next holder redoes it with the same seeds.  Thin: the logic is ``step_search``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from stepq.models import jobs, queries
from stepq.models.errors import ConfigError
from stepq.models.problems import Problem, ProblemSet
from stepq.models.search import FINISH, STEP_SEARCHES, StepSearch
from stepq.workers.backends import GenerationBackend, SamplingParams
from stepq.workers.jobqueue import runner as queue
from stepq.workers.labelling.rollouts import WorkerRuntime
from stepq.workers.search.pairwise import VERDICT_BY, ModelPairwiseJudge, PairwiseJudge, SyntheticPairwiseOracle
from stepq.workers.search.step_search import SearchSpec, next_turn, replay

log = logging.getLogger(__name__)
ORACLE = "synthetic-oracle"
JUDGE_KEYS = ("sampling", "verdict_by")
"""Keys of a judge's config that say how it is asked, not how its backend is built."""


def judge_for(
    make: Callable[[str, dict[str, Any]], GenerationBackend], backend: str, config: dict[str, Any]
) -> PairwiseJudge:
    """The search's pairwise judge: the synthetic oracle, or a model on a backend that ``make``
    builds (a worker's warm one, or a fresh one for an evaluation)."""
    if backend == ORACLE:
        return SyntheticPairwiseOracle()
    engine = make(backend, {k: v for k, v in config.items() if k not in JUDGE_KEYS})
    sampling = {"temperature": 0.0, "max_tokens": 1024, **(config.get("sampling") or {})}
    verdict_by = str(config.get("verdict_by", "text"))
    if verdict_by not in VERDICT_BY:
        raise ConfigError(f"judge verdict_by '{verdict_by}' is not one of: {', '.join(VERDICT_BY)}")
    return ModelPairwiseJudge(engine, SamplingParams.from_config(sampling), verdict_by=verdict_by)


def run_searches(rt: WorkerRuntime, ids: Sequence[int]) -> dict[int, str]:
    """Each search's status: done, skipped (someone else has it), lost, handed-back, failed."""
    out: dict[int, str] = {}
    for sid in ids:
        if rt.stopping.is_set():
            out[sid] = "handed-back"  # still queued: the dispatcher republishes it once lost
            continue
        out[sid] = run_search(rt, sid)
    return out


def run_search(rt: WorkerRuntime, search_id: int) -> str:
    """Run one search to its end under its lease; the heartbeat renews the lease only while
    this runs (a search whose task died for any reason expires and is taken over)."""
    with rt.held.holding(STEP_SEARCHES, [search_id]):
        return _run_search(rt, search_id)


def _run_search(rt: WorkerRuntime, search_id: int) -> str:
    ttl = rt.options.lease_ttl_s
    with rt.db.session() as s:
        if not jobs.claim(s, STEP_SEARCHES, search_id, rt.name, ttl):
            return "skipped"
        search = s.get_one(StepSearch, search_id)
        spec, pset, judge_backend, judge_config = _load(s, search)
        policy_model, sampling = search.policy_model, search.sampling
        turns = [(t.action, list(t.candidates), t.chosen) for t in queries.search_turns(s, search_id)]
    try:
        if policy_model is None:
            policy = rt.backend_for(pset)
        else:  # a later round's policy: the trained model, on the set's backend
            policy = rt.backend_named(pset.backend, {**(pset.backend_config or {}), "model": policy_model})
        params = SamplingParams.from_config({**(pset.sampling or {}), **(sampling or {})})
        judge = judge_for(rt.backend_named, judge_backend, judge_config)
        prefix, finished = replay(turns)
        turn_no = len(turns)
        while not finished and turn_no < spec.max_turns:
            if rt.stopping.is_set():
                queue.hand_back(rt.db, {STEP_SEARCHES: [search_id]}, rt.name)
                return "handed-back"
            with rt.deadline(f"step search {search_id} turn {turn_no}"):
                turn = next_turn(spec, turn_no, prefix, policy, params, judge)
            finished = turn.action == FINISH
            outcome = "finished" if finished else ("exhausted" if turn_no + 1 >= spec.max_turns else None)
            with rt.db.session() as s:
                if not queries.record_turn(s, search_id, rt.name, ttl, {**turn.row(), "worker": rt.name}, outcome):
                    log.warning("step search %s: lease lost at turn %s", search_id, turn_no)
                    return "lost"
            turns.append((turn.action, turn.candidates, turn.chosen))
            prefix, finished = replay(turns)
            turn_no += 1
        return "done"
    except Exception as exc:  # an attempt counted, retried with backoff unless permanent
        return queue.fail(rt.db, STEP_SEARCHES, search_id, rt.name, exc, rt.retry)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt: released, then on its way
        queue.release_unfinished(rt.db, STEP_SEARCHES, [search_id], rt.name, exc, rt.retry, rt.held)
        raise


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
