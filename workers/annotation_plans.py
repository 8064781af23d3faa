"""Configure a problem set's annotation and plan the work it implies (only what is missing)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import ConfigError, NotFoundError
from stepq.workers.backends import SamplingParams, check_config, check_storable
from stepq.workers.backends.synthetic import require_synthetic_problems
from stepq.workers.labelling.budget import parse_budget
from stepq.workers.labelling.labels import parse_rule
from stepq.workers.priority.rounds import RoundReport, set_priority


@dataclass(frozen=True)
class PlanReport:
    rollouts_per_prefix: int
    label_rule: str
    budget_policy: str
    work_items: int
    ordered: RoundReport | None = None
    """The priority round ``--priority`` started (None: the order was left as it was)."""
    overridden: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """The settings this call changed, each as (before, after): another command's M, rule or
    budget replaced is said, not silent."""


def generation_changes(
    before: tuple[str, dict[str, Any], dict[str, Any]], after: tuple[str, dict[str, Any], dict[str, Any]]
) -> list[str]:
    """What differs between two (backend, backend config, sampling) settings, in words;
    sampling is compared as its effective values, so spelling out a default changes nothing."""
    out = []
    if before[0] != after[0]:
        out.append(f"backend {before[0]} -> {after[0]}")
    for key in sorted(set(before[1]) | set(after[1])):
        if before[1].get(key) != after[1].get(key):
            out.append(f"{key} {before[1].get(key)} -> {after[1].get(key)}")
    old, new = SamplingParams.from_config(before[2]), SamplingParams.from_config(after[2])
    for f in fields(old):
        if getattr(old, f.name) != getattr(new, f.name):
            out.append(f"{f.name} {getattr(old, f.name)} -> {getattr(new, f.name)}")
    return out


MAX_ROLLOUTS = 4096
"""Rollouts per prefix at most: StepWiser's M is 16 and a reference 64; 10^8 was accepted and
planned as if it could be sampled."""


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
    resample: bool = False,
    priority: str | None = None,
    priority_aging_s: float | None = None,
) -> PlanReport:
    """Set M (and optionally the rule, budget, backend and sampling), then plan work.

    New trajectories get work items; when M, the rule or the budget changed, the set's
    finished items are reopened, and each task works out from the stored rollouts what,
    if anything, is still missing.  A Q-value is a mean over draws of one distribution, so
    changing how a set with rollouts samples (backend, model, sampling) is refused unless
    ``resample``: then its rollouts, and the Q-values and labels made of them, are discarded
    and every item samples again with the new settings, while workers run (a batch they
    sampled the old way is never written: ``queries.fence_write``).  ``resample`` with
    the settings unchanged samples again all the same: the command can be run again.
    """
    if not 1 <= m <= MAX_ROLLOUTS:
        raise ConfigError(f"rollouts per prefix: {m} is not between 1 and {MAX_ROLLOUTS}")
    if sampling:
        SamplingParams.from_config(sampling)  # refuses a temperature, top_p or max_tokens out of range
    if backend is not None:
        check_config(backend, dict(backend_config or {}))
        check_storable(dict(backend_config or {}), f"set '{set_name}'")
    with db.session() as s:
        pset = queries.get_set(s, set_name, for_update=True)
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
        generation_before = (pset.backend, dict(pset.backend_config or {}), dict(pset.sampling or {}))
        pset.rollouts_per_prefix = m
        if rule is not None:
            pset.label_rule = parse_rule(rule).key
        if budget is not None:
            pset.budget_policy = parse_budget(budget).pinned
        if backend is not None:
            pset.backend, pset.backend_config = backend, dict(backend_config or {})
        if sampling:
            pset.sampling = {**pset.sampling, **sampling}
        changed = generation_changes(generation_before, (pset.backend, pset.backend_config, pset.sampling))
        discarded = False
        if (changed or resample) and queries.set_has_rollouts(s, pset.id):
            if not resample:
                raise ConfigError(
                    f"set '{set_name}' has rollouts sampled with other settings ({'; '.join(changed)}): a Q-value "
                    "must average draws of one distribution.  Either annotate a new set with the new settings, "
                    "or pass --resample to discard this set's rollouts, Q-values and labels and sample them "
                    "again with the new settings"
                )
            queries.discard_rollouts(s, pset.id)
            discarded = True
        s.flush()
        planned = queries.plan_work(s, pset.id)
        if discarded or (pset.rollouts_per_prefix, pset.label_rule, pset.budget_policy) != before:
            planned += queries.reopen_set(s, pset.id)
        ordered = None
        if priority is not None or priority_aging_s is not None:
            ordered = set_priority(s, pset, priority or pset.priority_strategy, priority_aging_s)
        after = (pset.rollouts_per_prefix, pset.label_rule, pset.budget_policy)
        names = ("rollouts_per_prefix", "label_rule", "budget_policy")
        annotated_before = before[0] > 0  # a set never annotated has no settings to override
        overridden = {n: (b, a) for n, b, a in zip(names, before, after, strict=True) if b != a and annotated_before}
        return PlanReport(*after, planned, ordered, overridden)
