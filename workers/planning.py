"""Configure a problem set's annotation and plan the work it implies (only what is missing)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.workers.backends import BACKENDS
from stepq.workers.budget import parse_budget
from stepq.workers.labels import parse_rule


@dataclass(frozen=True)
class PlanReport:
    rollouts_per_prefix: int
    label_rule: str
    budget_policy: str
    work_items: int


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
    with db.session() as s:
        pset = queries.get_set(s, set_name)
        ungradable = queries.problems_without_reference(s, pset.id)
        if ungradable:
            raise ConfigError(
                f"set '{set_name}' has {ungradable} problems without a reference answer: rollouts could not be "
                "graded (ingest the answers, or keep the set for evaluation only)"
            )
        before = (pset.rollouts_per_prefix, pset.label_rule, pset.budget_policy)
        pset.rollouts_per_prefix = m
        if rule is not None:
            pset.label_rule = parse_rule(rule).key
        if budget is not None:
            pset.budget_policy = parse_budget(budget).spec
        if backend is not None:
            if backend not in BACKENDS:
                raise ConfigError(f"unknown generation backend '{backend}' (one of: {', '.join(BACKENDS)})")
            pset.backend, pset.backend_config = backend, dict(backend_config or {})
        if sampling:
            pset.sampling = {**pset.sampling, **sampling}
        s.flush()
        planned = queries.plan_work(s, pset.id)
        if (pset.rollouts_per_prefix, pset.label_rule, pset.budget_policy) != before:
            planned += queries.reopen_set(s, pset.id)
        return PlanReport(pset.rollouts_per_prefix, pset.label_rule, pset.budget_policy, planned)
