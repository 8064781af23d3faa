"""Evaluations that read the database: a judge on a snapshot's validation split, Best-of-N
over a set's trajectories, and chunk-reset on a set's problems with the set's policy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.models.snapshots import VALIDATION
from stepq.trainer.evaluation.best_of_n import BestOfNRow, Candidate, best_of_n
from stepq.trainer.evaluation.chunk_reset import PolicyProblem, chunk_reset
from stepq.trainer.evaluation.judges import AcceptAll, ScoringJudge, StepItem, StepJudge, judge_stats
from stepq.trainer.snapshots.export import snapshot_records
from stepq.workers.backends import SamplingParams, make_backend
from stepq.workers.data.segmentation import set_cutting_method
from stepq.workers.search.pairwise import PairwiseJudge
from stepq.workers.search.step_search import candidate_params


def validation_accuracy(db: Database, ref: str | int, judge: StepJudge, batch: int = 64) -> dict[str, Any]:
    """Per-class and balanced accuracy (%) of ``judge`` on the snapshot's validation rows;
    no verdict counts as wrong."""
    rows = snapshot_records(db, ref)[VALIDATION]
    if not rows:
        raise ConfigError(f"snapshot {ref} has no validation rows (made with --val-fraction 0?)")
    hits = {"Positive": 0, "Negative": 0}
    seen = {"Positive": 0, "Negative": 0}
    before = judge_stats(judge)
    for start in range(0, len(rows), batch):
        part = rows[start : start + batch]
        items = [StepItem(r["problem"], tuple(r["history"]), r["chunk"], {"id": r["trajectory_id"]}) for r in part]
        for r, verdict in zip(part, judge.judge(items), strict=True):
            seen[r["label"]] += 1
            hits[r["label"]] += verdict is not None and verdict == (r["label"] == "Positive")
    pos = 100.0 * hits["Positive"] / seen["Positive"] if seen["Positive"] else 0.0
    neg = 100.0 * hits["Negative"] / seen["Negative"] if seen["Negative"] else 0.0
    return {
        "rows": len(rows),
        "accuracy_positive": pos,
        "accuracy_negative": neg,
        "balanced_accuracy": (pos + neg) / 2,
        **judge_stats(judge).since(before).as_dict(),
        "no_verdict_is": "wrong, whatever the label",
    }


def _set(db: Database, name: str) -> tuple[Any, dict[int, list[dict[str, Any]]]]:
    with db.session() as session:
        pset = queries.get_set(session, name)
        return pset, queries.set_solutions(session, pset.id)


def set_step_scores(db: Database, name: str, judge: StepJudge) -> tuple[list[list[Candidate]], list[list[list[float]]]]:
    """Every trajectory of the set as a Best-of-N candidate, grouped by problem, and each of its
    steps' scores: a scoring judge's (a PRM's) probabilities, or a judge's verdicts as 1
    (accepted) and 0 (not).  Scored once, so several picks can be read off the same scores."""
    _, solutions = _set(db, name)
    trajs = [t for ts in solutions.values() for t in ts]
    if not trajs:
        raise ConfigError(f"set '{name}' has no trajectories (stepq generate --samples N)")
    # every step of every trajectory goes to the judge in one call: one engine batch, not one
    # call per trajectory
    flat: list[list[float]]
    if isinstance(judge, ScoringJudge):
        rows = judge.score_solutions([(t["question"], t["chunks"]) for t in trajs])
        flat = [[0.0 if x is None else float(x) for x in row] for row in rows]
    else:
        items = [
            StepItem(t["question"], tuple(t["chunks"][:i]), t["chunks"][i])
            for t in trajs
            for i in range(len(t["chunks"]))
        ]
        verdicts = iter(judge.judge(items))
        flat = [[1.0 if next(verdicts) is True else 0.0 for _ in t["chunks"]] for t in trajs]
    per_traj = iter(flat)
    problems = [
        [Candidate(tuple(t["chunks"]), t["answer"], bool(t["outcome"])) for t in ts] for ts in solutions.values()
    ]
    scores = [[next(per_traj) for _ in ts] for ts in solutions.values()]
    return problems, scores


def set_best_of_n(
    db: Database, name: str, judge: StepJudge, ns: Sequence[int], how: str, choose: str = "best"
) -> list[BestOfNRow]:
    """Best-of-N over the set's trajectories (the first N per problem), each scored by its
    step scores (``set_step_scores``) aggregated with ``how``, chosen by ``choose``."""
    problems, scores = set_step_scores(db, name, judge)
    return best_of_n(problems, scores, ns, how, choose)


def _policy_problems(db: Database, name: str) -> tuple[Any, list[PolicyProblem]]:
    """The set and its problems as its policy saw them: the prompt its first trajectory was
    sampled from and the set's segmentation."""
    with db.session() as session:
        pset = queries.get_set(session, name)
        solutions = queries.set_solutions(session, pset.id)
        cut = set_cutting_method(session, pset.id, name)  # as the set's chunks were cut, or refused
    problems = [
        PolicyProblem(trajs[0]["prompt"], trajs[0]["question"], trajs[0]["reference"], cut)
        for trajs in solutions.values()
    ]
    if not problems:
        raise ConfigError(f"set '{name}' has no trajectories to take the policy prompt from (stepq generate)")
    return pset, problems


def set_step_search(
    db: Database, name: str, judge: PairwiseJudge, plan: dict[str, Any], seed: int, api_key: str | None = None
) -> dict[str, Any]:
    """Test-time step search with the pairwise ``judge`` against the policy alone on the set's
    problems, the set's backend as the policy; ``plan`` holds width, max_turns, scoring, the
    candidates' sampling (over the set's own max tokens and stops) and the baseline (greedy,
    the method's, unless ``sampled``)."""
    from stepq.trainer.evaluation.step_search_eval import search_at_test_time

    pset, problems = _policy_problems(db, name)
    backend = make_backend(pset.backend, pset.backend_config, api_key=api_key)
    params = candidate_params(pset.sampling, plan["sampling"])
    note = {}
    if pset.backend == "synthetic" and plan.get("baseline", "greedy") == "greedy":
        note = {"note": "the synthetic policy ignores the temperature: its greedy baseline is one seeded draw"}
    try:
        return note | search_at_test_time(
            backend,
            params,
            judge,
            problems,
            width=plan["width"],
            max_turns=plan["max_turns"],
            scoring=plan["scoring"],
            seed=seed,
            baseline=plan.get("baseline", "greedy"),
        )
    finally:
        backend.close()


def set_chunk_reset(
    db: Database, name: str, judge: StepJudge, retries: int, seed: int, api_key: str | None = None
) -> dict[str, Any]:
    """Chunk-reset with ``judge`` (up to ``retries`` regenerations of a rejected chunk) and
    plain chunk-by-chunk sampling (no retry, same seeds) on the set's problems, with the set's
    backend as the policy."""
    pset, problems = _policy_problems(db, name)
    backend = make_backend(pset.backend, pset.backend_config, api_key=api_key)
    params = SamplingParams.from_config(pset.sampling or {})
    try:
        plain = chunk_reset(backend, params, AcceptAll(), problems, max_retries=0, seed=seed)
        reset = chunk_reset(backend, params, judge, problems, max_retries=retries, seed=seed)
    finally:
        backend.close()
    return {
        "plain": {**plain.as_dict(), "outcomes": plain.outcomes},
        "chunk_reset": {**reset.as_dict(), "outcomes": reset.outcomes},
    }
