"""The work of one task: claim a trajectory's work item, generate the missing rollouts,
grade them, and write them with Q-values and labels in small committed batches.

This is the same code in a Celery worker and in the embedded runner; the Celery task is
a thin wrapper around :func:`run_work_item`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from models import Database, queries
from models.errors import ConfigError, LeaseLost
from models.problems import ProblemSet
from models.rollouts import Rollout
from workers.backends import GenerationBackend, GenerationRequest, SamplingParams, generator_id, make_backend
from workers.budget import parse_budget
from workers.grading import Grader
from workers.labels import parse_rule
from workers.qvalues import TrajectoryLabeller
from workers.synthetic import derive_seed

log = logging.getLogger("stepq.worker")


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker process behaves; built from the settings by the front end."""

    lease_ttl_s: float = 300.0
    batch_rollouts: int = 128
    max_attempts: int = 5
    name: str | None = None
    store_text: bool = True
    """Keep each rollout's text; off keeps only answer, reward and tokens (~2 KB less a row)."""


@dataclass
class WorkerRuntime:
    """What a worker process keeps between tasks: database, grader, warm backends."""

    db: Database
    options: WorkerOptions = field(default_factory=WorkerOptions)
    grader: Grader = field(default_factory=Grader)
    backend_override: GenerationBackend | None = None
    _backends: dict[str, GenerationBackend] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.name = self.options.name or f"{socket.gethostname()}:{os.getpid()}"

    def backend_for(self, pset: ProblemSet) -> GenerationBackend:
        if self.backend_override is not None:
            return self.backend_override
        key = pset.backend + json.dumps(pset.backend_config, sort_keys=True)
        if key not in self._backends:
            self._backends[key] = make_backend(pset.backend, pset.backend_config)
        return self._backends[key]

    def close(self) -> None:
        for backend in self._backends.values():
            backend.close()
        self._backends.clear()


@dataclass(frozen=True)
class WorkOutcome:
    status: str  # done | skipped | lost | failed | retry
    written: int = 0


def first_batch(requests: dict[int, list[int]], size: int) -> list[tuple[int, list[int]]]:
    """The next generate call: whole prefixes in order, about ``size`` rollouts, so the
    engine's prefix cache serves each prefix's M samples together."""
    batch: list[tuple[int, list[int]]] = []
    count = 0
    for k in sorted(requests):
        room = size - count
        if room <= 0:
            break
        part = requests[k][:room]
        batch.append((k, part))
        count += len(part)
    return batch


def run_work_item(rt: WorkerRuntime, work_id: int) -> WorkOutcome:
    """Do (the rest of) one work item; safe to call twice for the same id at once.

    Loops: ask the set's budget policy what to sample next, generate and grade one batch,
    commit it with the trajectory's Q-values and labels, and ask again, until the policy
    wants nothing more; "done" commits with the last batch.
    """
    opts = rt.options
    with rt.db.session() as s:
        trajectory_id = queries.claim_work(s, work_id, rt.name, opts.lease_ttl_s)
        if trajectory_id is None:
            return WorkOutcome("skipped")
        ctx = queries.load_work_context(s, trajectory_id)
    written = 0
    try:
        pset, traj, problem = ctx.problem_set, ctx.trajectory, ctx.problem
        if not problem.reference_answer:
            raise ConfigError(f"problem {problem.external_id} has no reference answer to grade against")
        policy = parse_budget(pset.budget_policy)
        rules = [parse_rule(pset.label_rule)]
        params = SamplingParams.from_config(pset.sampling)
        backend = rt.backend_for(pset)
        generator = generator_id(backend, params)
        labeller = TrajectoryLabeller(
            traj,
            ctx.chunks,
            pset.rollouts_per_prefix,
            policy,
            rules,
            policy.counts_trajectory() and traj.generator == generator,
        )
        prefixes = [traj.prompt]
        for chunk in ctx.chunks:
            prefixes.append(prefixes[-1] + chunk.text)
        decision = labeller.decide(ctx.rewards)
        first = True
        while True:
            batch = first_batch(decision.requests, opts.batch_rollouts)
            requests = [
                GenerationRequest(
                    prefixes[k],
                    tuple(derive_seed(pset.seed, problem.external_id, traj.source_key, k, j) for j in js),
                )
                for k, js in batch
            ]
            if not batch and not decision.done:
                raise RuntimeError(f"budget policy {policy.spec} asked for nothing new yet is not done")
            results = backend.generate(requests, params) if requests else []
            rows: list[dict[str, Any]] = []
            tokens = 0
            for (k, js), req, completions in zip(batch, requests, results, strict=True):
                for j, seed, comp in zip(js, req.seeds, completions, strict=True):
                    grade = rt.grader.grade(comp.text, problem.reference_answer)
                    tokens += comp.tokens
                    rows.append(
                        {
                            "trajectory_id": traj.id,
                            "prefix_len": k,
                            "sample_idx": j,
                            "seed": seed,
                            "text": comp.text if opts.store_text else "",
                            "final_answer": grade.answer,
                            "reward": grade.reward,
                            "tokens": comp.tokens,
                            "generator": generator,
                            "worker": rt.name,
                        }
                    )
            with rt.db.session() as s:
                if not queries.renew_lease(s, work_id, rt.name, opts.lease_ttl_s):
                    raise LeaseLost(f"lease on work item {work_id} was taken over")
                written += queries.insert_ignore(s, Rollout, rows)
                if first:
                    queries.mark_trajectory_counted(s, traj.id, labeller.trajectory_is_sample)
                    first = False
                decision = labeller.refresh(s)
                queries.heartbeat(
                    s,
                    rt.name,
                    hostname=socket.gethostname(),
                    pid=os.getpid(),
                    backend=backend.generator,
                    rollouts=len(rows),
                    tokens=tokens,
                )
                if decision.done:  # the last batch commits together with "done"
                    queries.finish_work(s, work_id, rt.name)
            if decision.done:
                return WorkOutcome("done", written)
    except LeaseLost as exc:
        log.warning("%s", exc)
        return WorkOutcome("lost", written)
    except Exception as exc:
        log.exception("work item %s failed", work_id)
        with rt.db.session() as s:
            status = queries.fail_or_retry(s, work_id, rt.name, f"{type(exc).__name__}: {exc}", opts.max_attempts)
        return WorkOutcome(status, written)
