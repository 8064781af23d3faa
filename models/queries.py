"""Every query the annotation engine runs against its tables, in one place to import from.

Tasks, the dispatcher and the CLI call these; none of them builds SQL of its own.  All
writes are idempotent: inserts ignore conflicts on the natural unique keys, and state
changes are conditional updates whose row count says whether this process won.  They live
by concept in ``set_queries`` (sets, problems, trajectories), ``work_queries`` (planning
rollout work), ``rollout_queries`` (rollouts, Q-values, labels) and ``fleet_queries``
(locks, events, workers, progress), with the shared statements in ``sql``; the trainer's
are in ``training_queries`` and step search's in ``search_queries``.  The job queue's
lifecycle, common to every kind of queue work, is ``jobs`` (on top of the ``leases``
primitive that training runs and locks use too).
"""

from __future__ import annotations

from stepq.models.fleet_queries import (
    acquire_lock,
    count_event,
    event_counts,
    heartbeat,
    live_worker_count,
    live_workers,
    lock_holder,
    progress,
    progress_history,
    progress_since,
    record_progress,
    recount,
    release_lock,
    segmentation_stats,
    worker_stopped,
)
from stepq.models.rollout_queries import (
    WorkContext,
    label_rules_of,
    load_work_context,
    rollout_rewards,
    rollouts_to_regrade,
    update_grades,
    upsert_labels,
    upsert_q_values,
)
from stepq.models.set_queries import (
    add_trajectory,
    delete_set,
    delete_trajectories_of,
    discard_rollouts,
    ensure_set,
    existing_problem_ids,
    flag_for_planning,
    get_set,
    ingested_texts,
    labels_with_truth,
    pause_set,
    policy_outcomes,
    problem_contents,
    problems_without_reference,
    regrade_outcomes,
    replace_chunks,
    set_excluded,
    set_has_rollouts,
    set_problems,
    set_trajectory_ids,
    trajectory_chunks,
    trajectory_ids_of,
    trajectory_keys,
    unannotated_trajectories,
    update_problems,
)
from stepq.models.sql import (
    _insert,
    insert_ignore,
)
from stepq.models.work_queries import (
    mark_trajectory_counted,
    plan_work,
    reopen_set,
    reopen_trajectories,
    trajectory_counted,
    work_counts,
)

__all__ = [
    "WorkContext",
    "_insert",
    "acquire_lock",
    "add_trajectory",
    "count_event",
    "delete_set",
    "delete_trajectories_of",
    "discard_rollouts",
    "ensure_set",
    "event_counts",
    "existing_problem_ids",
    "flag_for_planning",
    "get_set",
    "heartbeat",
    "ingested_texts",
    "insert_ignore",
    "label_rules_of",
    "labels_with_truth",
    "live_worker_count",
    "live_workers",
    "load_work_context",
    "lock_holder",
    "mark_trajectory_counted",
    "pause_set",
    "plan_work",
    "policy_outcomes",
    "problem_contents",
    "problems_without_reference",
    "progress",
    "progress_history",
    "progress_since",
    "record_progress",
    "recount",
    "regrade_outcomes",
    "release_lock",
    "reopen_set",
    "reopen_trajectories",
    "replace_chunks",
    "rollout_rewards",
    "rollouts_to_regrade",
    "segmentation_stats",
    "set_excluded",
    "set_has_rollouts",
    "set_problems",
    "set_trajectory_ids",
    "trajectory_chunks",
    "trajectory_counted",
    "trajectory_ids_of",
    "trajectory_keys",
    "unannotated_trajectories",
    "update_grades",
    "update_problems",
    "upsert_labels",
    "upsert_q_values",
    "work_counts",
    "worker_stopped",
]
