"""Configure a problem set's annotation and plan the work it implies (only what is missing)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import ConfigError, NotFoundError
from stepq.workers.backends import check_config
from stepq.workers.budget import parse_budget
from stepq.workers.labels import parse_rule
from stepq.workers.synthetic_policy import is_synthetic_question


@dataclass(frozen=True)
class PlanReport:
    rollouts_per_prefix: int
    label_rule: str
    budget_policy: str
    work_items: int


def require_synthetic_problems(session: Any, set_id: int, backend: str, set_name: str) -> None:
    """The synthetic backend continues only synthetic arithmetic problems: say so before
    anything is stored or sampled, not as a worker's ValueError."""
    if backend != "synthetic":
        return
    first = queries.set_problems(session, set_id, limit=1)
    if first and not is_synthetic_question(first[0].question):
        raise ConfigError(
            f"set '{set_name}' holds problems the synthetic backend cannot continue (it knows only 'stepq synth' "
            "problems): choose --backend vllm, openai or hf with --model"
        )


def configure_annotation(
    db: Database,
    set_name: str,
    m: int,
    *,
    rule: str | None = None,
    budget: str | None = None,
    backend: str | None = None,
    backend_config: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None,
) -> PlanReport:
    """Set M (and optionally the rule, budget, backend and sampling), then plan work.

    New trajectories get work items; when M, the rule or the budget changed, the set's
    finished items are reopened, and each task works out from the stored rollouts what,
    if anything, is still missing.
    """
    if backend is not None:
        check_config(backend, dict(backend_config or {}))
    with db.session() as s:
        pset = queries.get_set(s, set_name)
        if not queries.set_trajectory_ids(s, pset.id, limit=1):
            raise NotFoundError(
                f"set '{set_name}' has no trajectories to annotate: sample them with "
                f"'stepq generate --set {set_name} --samples K' or ingest them with '--steps FIELD'"
            )
        ungradable = queries.problems_without_reference(s, pset.id)
        if ungradable:
            raise ConfigError(
                f"set '{set_name}' has {ungradable} problems without a reference answer: rollouts could not be "
                "graded (ingest the answers, or keep the set for evaluation only)"
            )
        require_synthetic_problems(s, pset.id, backend or pset.backend, set_name)
        before = (pset.rollouts_per_prefix, pset.label_rule, pset.budget_policy)
        pset.rollouts_per_prefix = m
        if rule is not None:
            pset.label_rule = parse_rule(rule).key
        if budget is not None:
            pset.budget_policy = parse_budget(budget).pinned
        if backend is not None:
            pset.backend, pset.backend_config = backend, dict(backend_config or {})
        if sampling:
            pset.sampling = {**pset.sampling, **sampling}
        s.flush()
        planned = queries.plan_work(s, pset.id)
        if (pset.rollouts_per_prefix, pset.label_rule, pset.budget_policy) != before:
            planned += queries.reopen_set(s, pset.id)
        return PlanReport(pset.rollouts_per_prefix, pset.label_rule, pset.budget_policy, planned)
