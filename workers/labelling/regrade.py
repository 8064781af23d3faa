"""Re-grade stored answers without sampling again, and bring Q-values and labels along.

Rollouts record how they were graded (``grade_method``); answers whose grading timed out
or failed can be re-graded later (with a longer ``STEPQ_GRADE_TIMEOUT_S``, or after a
grader fix), and every other answer when the grader itself changed.  A rollout is
re-graded from its stored text, or, when texts are not kept, from its stored final answer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from stepq.models import Database, queries
from stepq.workers.grading.grader import Grader
from stepq.workers.labelling.budget import parse_budget
from stepq.workers.labelling.labels import parse_rule
from stepq.workers.labelling.qvalues import relabel_trajectories

ONLY = {"timeouts": ("timeout",), "errors": ("timeout", "error"), "all": None}


@dataclass
class RegradeReport:
    examined: int = 0
    changed: int = 0
    """Rollouts whose reward changed."""
    unavailable: int = 0
    """Neither text nor final answer stored: nothing to grade."""
    trajectories: int = 0
    """Trajectories whose Q-values and labels were recomputed (and whose work reopened)."""
    methods: Counter[str] = field(default_factory=Counter)
    """How the examined rollouts are graded now."""


def regrade_trajectories(db: Database, set_name: str, trajectory_ids: list[int], grader: Grader) -> RegradeReport:
    """Re-grade every rollout of these trajectories (their problem's reference changed) and
    recompute their Q-values and labels, changed or not (their outcomes may have)."""
    report = regrade_set(db, set_name, grader, only="all", trajectory_ids=trajectory_ids)
    _relabel(db, set_name, sorted(trajectory_ids))
    return report


def regrade_set(
    db: Database,
    set_name: str,
    grader: Grader,
    *,
    only: str = "timeouts",
    batch: int = 1000,
    trajectory_ids: list[int] | None = None,
) -> RegradeReport:
    """Re-grade a set's rollouts (``only``: timeouts, errors or all), in committed batches."""
    methods = ONLY[only]
    report = RegradeReport()
    touched: set[int] = set()
    after = 0
    with db.session() as s:
        set_id = queries.get_set(s, set_name).id
    while True:
        with db.session() as s:
            rows = queries.rollouts_to_regrade(
                s, set_id, methods, after_id=after, limit=batch, trajectory_ids=trajectory_ids
            )
            if not rows:
                break
            updates = []
            for row in rows:
                after = row.id
                report.examined += 1
                source = row.text or (f"\\boxed{{{row.final_answer}}}" if row.final_answer else "")
                if not source:
                    report.unavailable += 1
                    report.methods[row.grade_method or "unknown"] += 1
                    continue
                grade = grader.grade(source, row.reference_answer)
                report.methods[grade.method] += 1
                if grade.reward != row.reward:
                    report.changed += 1
                    touched.add(row.trajectory_id)
                updates.append(
                    {"id": row.id, "reward": grade.reward, "grade_method": grade.method, "final_answer": grade.answer}
                )
            queries.update_grades(s, updates)
    report.trajectories = len(touched)
    _relabel(db, set_name, sorted(touched))
    return report


def _relabel(db: Database, set_name: str, trajectory_ids: list[int]) -> None:
    """Q-values and labels follow the new rewards; the work items reopen, so an adaptive
    budget can sample what the changed evidence now asks for."""
    if not trajectory_ids:
        return
    with db.session() as s:
        pset = queries.get_set(s, set_name)
        policy, m = parse_budget(pset.budget_policy), pset.rollouts_per_prefix
        rules = {pset.label_rule, *queries.label_rules_of(s, trajectory_ids)}
    if m == 0:  # the set is not configured for annotation: nothing to label
        return
    relabel_trajectories(db, trajectory_ids, m, policy, [parse_rule(r) for r in sorted(rules)], reopen=True)
