"""Start a step search over a problem set: one search row per problem (idempotent: starting
the same search again adds only problems that are new since), then the dispatcher publishes
them; or run them here, without a broker (the embedded default)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from stepq.models import Database, epoch, queries
from stepq.models import search_queries as sq
from stepq.models.errors import ConfigError
from stepq.workers.annotate import WorkerRuntime
from stepq.workers.prompts import load_template, render
from stepq.workers.search.pairwise import EACH_VERDICT, SCORINGS
from stepq.workers.search.runner import ORACLE, run_search


@dataclass(frozen=True)
class SearchPlan:
    set_name: str
    name: str
    width: int = 6
    max_turns: int = 20
    seed: int = 0
    template: str | None = None
    """Policy template name; default: ``synthetic`` for a synthetic set, else ``step``."""
    judge_backend: str = ORACLE
    judge_config: dict[str, Any] = field(default_factory=dict)
    scoring: str = EACH_VERDICT


def start_search(db: Database, plan: SearchPlan) -> int:
    """Create the searches; returns how many are new."""
    if plan.width < 2:
        raise ConfigError("a step search needs --width of at least 2 (candidates are compared in pairs)")
    if plan.scoring not in SCORINGS:
        raise ConfigError(f"unknown search scoring '{plan.scoring}' (one of: {', '.join(SCORINGS)})")
    if plan.max_turns < 1:
        raise ConfigError("--max-turns must be at least 1")
    with db.session() as s:
        pset = queries.get_set(s, plan.set_name)
        template = load_template(plan.template or ("synthetic" if pset.backend == "synthetic" else "step"))
        if plan.judge_backend == ORACLE and pset.backend != "synthetic":
            raise ConfigError("the synthetic-oracle judge only knows the synthetic policy's problems")
        rows = [
            {
                "name": plan.name,
                "problem_set_id": pset.id,
                "problem_id": pid,
                "prompt": render(template, question),
                "width": plan.width,
                "max_turns": plan.max_turns,
                "seed": plan.seed,
                "judge_backend": plan.judge_backend,
                "judge_config": plan.judge_config,
                "scoring": plan.scoring,
            }
            for pid, question in sq.problems_of_set(s, pset.id)
        ]
        if not rows:
            raise ConfigError(f"set '{plan.set_name}' has no problems to search")
        return sq.create_searches(s, rows)


def run_searches_here(db: Database, rt: WorkerRuntime, max_attempts: int = 5) -> Counter[str]:
    """Run every pending search in this process (no broker); returns outcome counts."""
    outcomes: Counter[str] = Counter()
    while True:
        with db.session() as s:
            sq.recover_searches(s, epoch(), None, max_attempts)
            ids = sq.queue_pending_searches(s, 100)
        if not ids:
            return outcomes
        for sid in ids:
            outcomes[run_search(rt, sid)] += 1
