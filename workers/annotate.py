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
from workers.backends import GenerationBackend, GenerationRequest, SamplingParams, make_backend
from workers.grading import Grader
from workers.labels import parse_rule
from workers.qvalues import refresh_trajectory
from workers.synthetic import derive_seed

log = logging.getLogger("stepq.worker")


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker process behaves; built from the settings by the front end."""

    lease_ttl_s: float = 300.0
    batch_rollouts: int = 128
    max_attempts: int = 5
    name: str | None = None


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


def missing_samples(done: dict[int, set[int]], n_chunks: int, m: int) -> list[tuple[int, list[int]]]:
    """(prefix, sample indices still missing) for prefixes 0..n-1 under budget m."""
    out = []
    for k in range(n_chunks):
        have = done.get(k, set())
        need = [j for j in range(m) if j not in have]
        if need:
            out.append((k, need))
    return out


def batches(missing: list[tuple[int, list[int]]], size: int) -> list[list[tuple[int, list[int]]]]:
    """Group (prefix, samples) into batches of about ``size`` rollouts, whole prefixes first,
    so each generate call shares as many prefixes as possible with the engine's cache."""
    out: list[list[tuple[int, list[int]]]] = []
    current: list[tuple[int, list[int]]] = []
    count = 0
    for k, samples in missing:
        for start in range(0, len(samples), size):
            part = samples[start : start + size]
            if current and count + len(part) > size:
                out.append(current)
                current, count = [], 0
            current.append((k, part))
            count += len(part)
    if current:
        out.append(current)
    return out


def run_work_item(rt: WorkerRuntime, work_id: int) -> WorkOutcome:
    """Do (the rest of) one work item; safe to call twice for the same id at once."""
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
        m = pset.rollouts_per_prefix
        rules = [parse_rule(pset.label_rule)]
        params = SamplingParams.from_config(pset.sampling)
        backend = rt.backend_for(pset)
        prefixes = [traj.prompt]
        for chunk in ctx.chunks:
            prefixes.append(prefixes[-1] + chunk.text)
        todo = batches(missing_samples(ctx.samples_done, traj.n_chunks, m), opts.batch_rollouts) or [[]]
        for number, batch in enumerate(todo, start=1):
            requests = [
                GenerationRequest(
                    prefixes[k],
                    tuple(derive_seed(pset.seed, problem.external_id, traj.source_key, k, j) for j in js),
                )
                for k, js in batch
            ]
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
                            "text": comp.text,
                            "final_answer": grade.answer,
                            "reward": grade.reward,
                            "tokens": comp.tokens,
                            "generator": f"{backend.generator}[{params.describe()}]",
                            "worker": rt.name,
                        }
                    )
            with rt.db.session() as s:
                if not queries.renew_lease(s, work_id, rt.name, opts.lease_ttl_s):
                    raise LeaseLost(f"lease on work item {work_id} was taken over")
                written += queries.insert_ignore(s, Rollout, rows)
                refresh_trajectory(s, traj, ctx.chunks, m, rules)
                queries.heartbeat(
                    s,
                    rt.name,
                    hostname=socket.gethostname(),
                    pid=os.getpid(),
                    backend=backend.generator,
                    rollouts=len(rows),
                    tokens=tokens,
                )
                if number == len(todo):  # the last batch commits together with "done"
                    queries.finish_work(s, work_id, rt.name)
        return WorkOutcome("done", written)
    except LeaseLost as exc:
        log.warning("%s", exc)
        return WorkOutcome("lost", written)
    except Exception as exc:
        log.exception("work item %s failed", work_id)
        with rt.db.session() as s:
            status = queries.fail_or_retry(s, work_id, rt.name, f"{type(exc).__name__}: {exc}", opts.max_attempts)
        return WorkOutcome(status, written)
