"""Prometheus metrics for a fleet, read from the database (and the broker) at each scrape.

One ``stepq metrics`` process serves the whole deployment: every worker already writes what
it did to the database (heartbeats with rollouts, tokens, engine time and grading outcomes),
the dispatcher counts lease expiries and lost messages, and the per-set counters are kept by
triggers.  So a scrape costs a few small queries whatever the fleet's size, and no worker
needs an open port.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from stepq.models import Database, jobs, queries
from stepq.models.work import ROLLOUT_WORK
from stepq.status import WORKER_LIVE_S, collect
from stepq.workers.jobqueue.dispatcher import DispatchOptions, broker_bound

STATES = ("pending", "queued", "running", "done", "failed")
SILENT_FOR_S = 3600.0
"""A worker silent (no heartbeat, never stopped) for longer than this is forgotten."""
RECENT_RUNS = 20
"""Training runs exported: every running one, and the most recent finished ones."""


class StepqCollector(Collector):
    """Builds every metric family from one read of the database per scrape."""

    def __init__(
        self,
        db: Database,
        queue_depth: Callable[[], int | None] = lambda: None,
        dispatch: DispatchOptions | None = None,
    ) -> None:
        self.db = db
        self.queue_depth = queue_depth
        self.dispatch = dispatch or DispatchOptions()

    def collect(self) -> Iterator[Any]:
        report = collect(self.db)
        with self.db.session() as s:
            events = queries.event_counts(s)
            troubles = jobs.troubles(s, ROLLOUT_WORK)
            now = time.time()
            workers = queries.live_workers(s, now - WORKER_LIVE_S)
            silent = queries.silent_worker_count(s, now - WORKER_LIVE_S, now - SILENT_FOR_S)
            runs = queries.training_progress(s)
        rollouts = CounterMetricFamily("stepq_rollouts", "Rollouts stored, per set", labels=["set"])
        planned = GaugeMetricFamily(
            "stepq_rollouts_planned", "Rollouts an exhaustive budget would draw", labels=["set"]
        )
        saved = GaugeMetricFamily(
            "stepq_rollouts_saved", "Rollouts the budget saved on finished trajectories, per set", labels=["set"]
        )
        done = GaugeMetricFamily(
            "stepq_done_percent",
            "done %: rollouts drawn over the rollouts the set will draw at most (its plan less the budget's "
            "savings), as stepq status shows it",
            labels=["set"],
        )
        rate = GaugeMetricFamily("stepq_rollouts_per_second", "Current rollout rate, per set", labels=["set"])
        eta = GaugeMetricFamily("stepq_eta_seconds", "Estimated seconds to finish, per set", labels=["set"])
        labelled = GaugeMetricFamily("stepq_labelled_chunks", "Chunks labelled under the set's rule", labels=["set"])
        tokens = CounterMetricFamily("stepq_tokens", "Tokens generated for the set's rollouts", labels=["set"])
        prompt_tokens = CounterMetricFamily(
            "stepq_prompt_tokens",
            "Tokens of the contexts the set's rollouts continued, where the engine reported them",
            labels=["set"],
        )
        tokens_saved = GaugeMetricFamily(
            "stepq_tokens_saved_estimate",
            "Tokens the budget did not spend (rollouts saved x the set's mean tokens per rollout)",
            labels=["set"],
        )
        trajectories = GaugeMetricFamily("stepq_trajectories_done", "Trajectories finished, per set", labels=["set"])
        items = GaugeMetricFamily("stepq_work_items", "Work items per set and state", labels=["set", "state"])
        retrying = GaugeMetricFamily("stepq_work_items_retrying", "Items backing off after an error", labels=["set"])
        for row in report["sets"]:
            name = row["problem_set"]
            rollouts.add_metric([name], row["rollouts_done"])
            planned.add_metric([name], row["rollouts_planned"])
            saved.add_metric([name], row["rollouts_saved"])
            if row["done_percent"] is not None:
                done.add_metric([name], row["done_percent"])
            rate.add_metric([name], row["rollouts_per_s"])
            if row["eta_s"] is not None:
                eta.add_metric([name], row["eta_s"])
            labelled.add_metric([name], row["labelled_chunks"])
            tokens.add_metric([name], row["tokens"])
            prompt_tokens.add_metric([name], row["prompt_tokens"])
            if row["tokens_saved_estimate"] is not None:
                tokens_saved.add_metric([name], row["tokens_saved_estimate"])
            trajectories.add_metric([name], row["trajectories_done"])
            for state in STATES:
                items.add_metric([name, state], row["work"].get(state, 0))
            retrying.add_metric([name], troubles.get(row["problem_set_id"], {}).get("retrying", 0))
        yield from (
            rollouts,
            planned,
            saved,
            done,
            rate,
            eta,
            labelled,
            tokens,
            prompt_tokens,
            tokens_saved,
            trajectories,
            items,
            retrying,
        )

        order = GaugeMetricFamily(
            "stepq_priority_round",
            "The priority round ordering a set's work (strategy and the judge's training run as labels)",
            labels=["set", "strategy", "judge_run"],
        )
        scoring = GaugeMetricFamily(
            "stepq_priority_scoring_jobs", "The current round's scoring jobs per state", labels=["set", "state"]
        )
        for row in report["sets"]:
            summary = row["priority"]
            if summary.get("round") is None:
                continue
            judge = "" if summary["judge_run_id"] is None else str(summary["judge_run_id"])
            order.add_metric([row["problem_set"], summary["strategy"], judge], summary["round"])
            for state in STATES:
                scoring.add_metric([row["problem_set"], state], summary["scoring"].get(state, 0))
        yield from (order, scoring)

        happened = CounterMetricFamily(
            "stepq_events", "Lease expiries, failed items, retries, lost messages", labels=["event"]
        )
        for name in ("lease_expiries", "items_failed", "retries", "messages_lost", "lost_leases"):
            happened.add_metric([name], events.get(name, 0))
        yield happened

        depth = self.queue_depth()
        queue = GaugeMetricFamily("stepq_broker_queue_depth", "Messages waiting in the broker queue")
        if depth is not None:
            queue.add_metric([], depth)
        yield queue

        labels = ["worker", "label", "backend"]
        w_rollouts = CounterMetricFamily("stepq_worker_rollouts", "Rollouts written by a live worker", labels=labels)
        w_tokens = CounterMetricFamily("stepq_worker_tokens", "Tokens generated by a live worker", labels=labels)
        w_engine = CounterMetricFamily(
            "stepq_worker_engine_seconds", "Seconds a live worker spent in generate calls", labels=labels
        )
        w_busy = GaugeMetricFamily("stepq_worker_busy_items", "Work items a live worker holds", labels=labels)
        w_grades = CounterMetricFamily(
            "stepq_worker_graded", "Rollouts graded by a live worker, per method", labels=[*labels, "method"]
        )
        for w in workers:
            key = [w["name"], w["label"], w["backend"]]
            w_rollouts.add_metric(key, w["rollouts"])
            w_tokens.add_metric(key, w["tokens"])
            w_engine.add_metric(key, w["engine_s"])
            w_busy.add_metric(key, w["busy_items"])
            for method, n in sorted(w["grades"].items()):
                w_grades.add_metric([*key, method], n)
        yield from (w_rollouts, w_tokens, w_engine, w_busy, w_grades)
        unhealthy = sum(1 for w in workers if w.get("unhealthy"))
        yield from self._fleet(len(workers) - unhealthy, silent, unhealthy)
        yield from self._training(runs)

    def _fleet(self, live: int, silent: int, unhealthy: int = 0) -> Iterator[Any]:
        states = GaugeMetricFamily(
            "stepq_workers",
            "Workers by state: live (a heartbeat within 30 s, taking work), unhealthy (alive, but the jobs "
            "it ran failed one after another: it takes no more) or silent (no heartbeat since, never "
            "stopped: crashed, frozen or cut off)",
            labels=["state"],
        )
        states.add_metric(["live"], live)
        states.add_metric(["unhealthy"], unhealthy)
        states.add_metric(["silent"], silent)
        yield states
        bound = broker_bound(self.dispatch, live)
        if bound is not None:
            yield GaugeMetricFamily(
                "stepq_broker_queue_bound",
                "Messages the dispatcher keeps queued at most (a few per live worker)",
                bound,
            )

    def _training(self, runs: list[dict[str, Any]]) -> Iterator[Any]:
        recent = sorted(runs, key=lambda r: r["run"])
        shown = [r for r in recent if r["status"] == "running"]
        shown += [r for r in recent[-RECENT_RUNS:] if r["status"] != "running"]
        labels = ["run", "method", "lineage"]
        step = GaugeMetricFamily("stepq_training_step", "A training run's global step", labels=[*labels, "status"])
        reward = GaugeMetricFamily("stepq_training_reward", "Mean reward at the run's last logged step", labels=labels)
        loss = GaugeMetricFamily("stepq_training_loss", "Loss at the run's last logged step", labels=labels)
        for r in shown:
            key = [str(r["run"]), str(r["method"]), str(r["lineage"] or "")]
            step.add_metric([*key, str(r["status"])], r["step"] or 0)
            if r["reward"] is not None:
                reward.add_metric(key, r["reward"])
            if r["loss"] is not None:
                loss.add_metric(key, r["loss"])
        yield from (step, reward, loss)
