"""The work of one task: claim a trajectory's work item, generate the missing rollouts,
grade them, and write them with Q-values and labels in small committed batches.

This is the same code in a Celery worker and in the embedded runner; the Celery task is
a thin wrapper around :func:`run_work_item`.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from stepq.models import Database, jobs, queries
from stepq.models.errors import ConfigError, GenerationError, LeaseLost
from stepq.models.problems import ProblemSet
from stepq.models.rollouts import Rollout
from stepq.models.work import ROLLOUT_WORK
from stepq.workers.backends import (
    Completion,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
    generator_id,
    make_backend,
)
from stepq.workers.jobqueue import runner as queue
from stepq.workers.jobqueue.heartbeat import Heartbeat
from stepq.workers.jobqueue.logcontext import bind
from stepq.workers.jobqueue.runner import HeldJobs, RetryPolicy
from stepq.workers.jobqueue.write_behind import WriteBehind
from stepq.workers.labelling.budget import parse_budget
from stepq.workers.labelling.grading import Grader
from stepq.workers.labelling.labels import parse_rule
from stepq.workers.labelling.qvalues import TrajectoryLabeller
from stepq.workers.seeds import derive_seed

log = logging.getLogger("stepq.worker")
GENERATE_TIMEOUT_EXIT = 69
"""EX_UNAVAILABLE: the engine stopped answering; the supervisor (Celery, compose) restarts us."""


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker process behaves; built from the settings by the front end."""

    lease_ttl_s: float = 300.0
    batch_rollouts: int = 128
    max_attempts: int = 5
    name: str | None = None
    """The operator's label for the process; its unique name adds host, pid and a random part."""
    store_text: bool = True
    """Keep each rollout's text; off keeps only answer, reward and tokens (~2 KB less a row)."""
    heartbeat_s: float = 10.0
    """Seconds between heartbeats (at most a third of the lease, whatever is set)."""
    retry_backoff_s: float = 5.0
    """A transient failure's first wait before the item is tried again (doubling, capped)."""
    generate_timeout_s: float = 0.0
    """A generate call (or a search turn) still running after this long is presumed hung: its
    work is handed back and the process exits (``GENERATE_TIMEOUT_EXIT``) for its supervisor to
    restart it.  0: no deadline."""
    write_behind: bool = False
    """Commit a trajectory's last batch on a background thread while the next task generates
    (``write_behind``); a queue worker's setting, not the embedded runner's, which reports each
    item as it is done."""

    @property
    def heartbeat_interval_s(self) -> float:
        return max(0.05, min(self.heartbeat_s, self.lease_ttl_s / 3))


@dataclass
class WorkerRuntime:
    """What a worker process keeps between tasks: database, grader, warm backends."""

    db: Database
    options: WorkerOptions = field(default_factory=WorkerOptions)
    grader: Grader = field(default_factory=Grader)
    backend_override: GenerationBackend | None = None
    owns_override: bool = False
    """Close the override with the runtime (a worker's engine: its processes must stop too)."""
    judge_override: Callable[[int], Any] | None = None
    """Priority scoring's judge for a training run id, instead of loading the run's model
    (tests, and benchmarks whose judge is a stand-in)."""
    _backends: dict[str, GenerationBackend] = field(default_factory=dict)
    judges: dict[tuple[int, int, float], Any] = field(default_factory=dict)
    """The warm judge of the latest priority round this process scored for."""

    def __post_init__(self) -> None:
        self.label = self.options.name or "worker"
        # Unique per process: every host may run workers under the same --name, and a
        # lease must never be mistaken for another process's.
        self.name = f"{self.label}@{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.held = HeldJobs()
        """The jobs (of every kind) this process's running tasks hold: what the heartbeat renews."""
        self.retry = RetryPolicy(self.options.max_attempts, self.options.retry_backoff_s)
        self.writer = WriteBehind(self.held) if self.options.write_behind else None
        self.engine_s = 0.0
        """Seconds spent inside generate calls (metrics: engine time per worker)."""
        self.grades: Counter[str] = Counter()
        """Rollouts graded, per grading method (metrics: grading outcomes per worker)."""
        self.stopping = threading.Event()
        """Set when the process is asked to stop: tasks hand their items back after the batch
        in flight instead of finishing them."""
        self._generator = self.backend_override.generator if self.backend_override else "per-set"
        self.heartbeat = Heartbeat(
            self.db,
            self.name,
            label=self.label,
            interval_s=self.options.heartbeat_interval_s,
            lease_ttl_s=self.options.lease_ttl_s,
            busy=lambda: len(self.held),
            backend=lambda: self._generator,
            totals=lambda: (self.engine_s, dict(self.grades)),
            held=self.held,
        )

    def request_stop(self) -> None:
        self.stopping.set()

    def start(self) -> WorkerRuntime:
        """Start the heartbeat (live worker, renewed leases); ``close`` stops it."""
        self.heartbeat.start()
        return self

    @property
    def busy_items(self) -> int:
        return len(self.held)

    @contextmanager
    def deadline(self, what: str) -> Iterator[None]:
        """Bound a call that may hang in an engine or a server (``generate_timeout_s``): the
        heartbeat would renew its leases for ever, so past the deadline the work goes back
        and the process goes down (a thread stuck in native code cannot be stopped)."""
        limit = self.options.generate_timeout_s
        if not limit:
            yield
            return
        timer = threading.Timer(limit, self._deadline_passed, args=(what, limit))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _deadline_passed(self, what: str, limit: float) -> None:
        held = self.held.now()
        log.error(
            "%s did not return within %.0f s (STEPQ_GENERATE_TIMEOUT_S): failing %s (an attempt each), and "
            "exiting for the supervisor to restart this worker",
            what,
            limit,
            ", ".join(f"{len(ids)} {table.name} jobs" for table, ids in held.items()) or "nothing",
        )
        # A hang counts as an attempt, with its error recorded: a request that always hangs the
        # engine gives up after the retry policy's limit instead of being retried for ever.
        hung = GenerationError(f"{what} did not return within {limit:.0f} s (STEPQ_GENERATE_TIMEOUT_S)")
        try:
            for table, ids in held.items():
                for job_id in ids:
                    queue.fail(self.db, table, job_id, self.name, hung, self.retry)
        except Exception as exc:  # their leases, no longer renewed once we are gone, expire
            log.error("could not record the hung work (%s); its leases will expire", exc)
        logging.shutdown()
        os._exit(GENERATE_TIMEOUT_EXIT)

    def backend_for(self, pset: ProblemSet) -> GenerationBackend:
        """The set's policy (or the worker's own engine), kept warm across tasks."""
        if self.backend_override is not None:
            return self.backend_override
        backend = self.backend_named(pset.backend, pset.backend_config)
        self._generator = backend.generator
        return backend

    def backend_named(self, name: str, config: dict[str, Any]) -> GenerationBackend:
        """A backend by name and config, built once per process (a judge's, a set's)."""
        key = name + json.dumps(config, sort_keys=True)
        if key not in self._backends:
            self._backends[key] = make_backend(name, config)
        return self._backends[key]

    def close(self) -> None:
        if self.writer is not None:  # while the heartbeat still renews what it holds
            self.writer.close()
        self.heartbeat.stop()
        for backend in self._backends.values():
            backend.close()
        self._backends.clear()
        if self.owns_override and self.backend_override is not None:
            self.backend_override.close()
        self.grader.close()


@dataclass(frozen=True)
class WorkOutcome:
    status: str  # done | skipped | lost | failed | retry | handed-back | writing (write-behind has it)


def next_batch(requests: dict[int, list[int]], size: int) -> list[tuple[int, list[int]]]:
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


class TrajectoryJob:
    """One claimed work item while a task runs it: its budget decision and what to write."""

    def __init__(self, rt: WorkerRuntime, work_id: int, ctx: queries.WorkContext) -> None:
        self.rt, self.work_id, self.ctx = rt, work_id, ctx
        self.set_name = ctx.problem_set.name
        pset, traj, problem = ctx.problem_set, ctx.trajectory, ctx.problem
        if not problem.reference_answer:
            raise ConfigError(f"problem {problem.external_id} has no reference answer to grade against")
        self.policy = parse_budget(pset.budget_policy)
        self.params = SamplingParams.from_config(pset.sampling)
        self.backend = rt.backend_for(pset)
        self.generator = generator_id(self.backend, self.params)
        if ctx.generator is not None and ctx.generator != self.generator:
            # One trajectory's samples must be draws of one distribution.
            raise GenerationError(
                f"trajectory {traj.id} was sampled by {ctx.generator}, this worker generates with "
                f"{self.generator}: run it on a worker with that backend and sampling"
            )
        self.labeller = TrajectoryLabeller(
            traj,
            ctx.chunks,
            pset.rollouts_per_prefix,
            self.policy,
            parse_rule(pset.label_rule),
            self.policy.counts_trajectory() and traj.generator == self.generator,
            ctx.siblings,
        )
        self.prefixes = [traj.prompt]
        for chunk in ctx.chunks:
            self.prefixes.append(self.prefixes[-1] + chunk.text)
        self.decision = self.labeller.decide(ctx.rewards)
        self.batch: list[tuple[int, list[int]]] = []
        self.first = True

    @property
    def last_batch(self) -> bool:
        """This batch surely finishes the trajectory: its budget asks once and the batch
        serves every request (so nothing waits on what it says)."""
        asked = sum(len(js) for js in self.decision.requests.values())
        return self.policy.asks_once and sum(len(js) for _, js in self.batch) == asked

    def next_requests(self) -> list[GenerationRequest]:
        """The next batch: the whole round when it fits, so a crash never splits one."""
        self.batch = next_batch(self.decision.requests, self.rt.options.batch_rollouts)
        if not self.batch and not self.decision.done:
            raise RuntimeError(f"budget policy {self.policy.spec} asked for nothing new yet is not done")
        pset, problem, traj = self.ctx.problem_set, self.ctx.problem, self.ctx.trajectory
        return [
            GenerationRequest(
                self.prefixes[k],
                tuple(derive_seed(pset.seed, problem.external_id, traj.source_key, k, j) for j in js),
            )
            for k, js in self.batch
        ]

    def write(self, requests: list[GenerationRequest], results: list[list[Completion]]) -> bool:
        """Grade and commit one batch with Q-values, labels and (when nothing is left) "done"."""
        rt, opts, traj = self.rt, self.rt.options, self.ctx.trajectory
        rows: list[dict[str, Any]] = []
        tokens = 0
        for (k, js), req, completions in zip(self.batch, requests, results, strict=True):
            for j, seed, comp in zip(js, req.seeds, completions, strict=True):
                grade = rt.grader.grade(comp.text, self.ctx.problem.reference_answer)
                rt.grades[grade.method] += 1
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
                        "grade_method": grade.method,
                        "tokens": comp.tokens,
                        "prompt_tokens": comp.prompt_tokens,
                        "generator": self.generator,
                        "worker": rt.name,
                    }
                )
        with rt.db.session() as s:
            if not jobs.renew(s, ROLLOUT_WORK, [self.work_id], rt.name, opts.lease_ttl_s):
                raise LeaseLost(f"lease on work item {self.work_id} was taken over")
            queries.insert_ignore(s, Rollout, rows)
            if self.first:
                queries.mark_trajectory_counted(s, traj.id, self.labeller.trajectory_is_sample)
                self.first = False
            self.decision = self.labeller.refresh(s)
            queries.heartbeat(
                s,
                rt.name,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                backend=self.backend.generator,
                rollouts=len(rows),
                tokens=tokens,
                busy_items=rt.busy_items,
                label=rt.label,
                engine_s=rt.engine_s,
                grades=dict(rt.grades),
            )
            if self.decision.done:  # the last batch commits together with "done"
                jobs.finish(s, ROLLOUT_WORK, self.work_id, rt.name)
        return self.decision.done


def _fail(rt: WorkerRuntime, work_id: int, exc: Exception, set_name: str | None = None) -> str:
    return queue.fail(rt.db, ROLLOUT_WORK, work_id, rt.name, exc, rt.retry, set=set_name)


def _engine_call_isolated(
    backend: GenerationBackend,
    members: list[tuple[TrajectoryJob, list[GenerationRequest]]],
    params: SamplingParams,
) -> list[tuple[TrajectoryJob, list[GenerationRequest], list[list[Completion]] | Exception]]:
    """One engine call for every member; when it fails, one call per member, so a request
    that fails (a context over the model's limit) fails only its own work item."""
    everything = [r for _, reqs in members for r in reqs]
    try:
        results = backend.generate(everything, params) if everything else []
    except Exception as exc:
        if len(members) == 1:
            return [(members[0][0], members[0][1], exc)]
        log.warning("a batch of %d work items failed (%s); retrying them one by one", len(members), exc)
        out: list[tuple[TrajectoryJob, list[GenerationRequest], list[list[Completion]] | Exception]] = []
        for job, reqs in members:
            try:
                out.append((job, reqs, backend.generate(reqs, params)))
            except Exception as own:
                out.append((job, reqs, own))
        return out
    split: list[tuple[TrajectoryJob, list[GenerationRequest], list[list[Completion]] | Exception]] = []
    offset = 0
    for job, reqs in members:
        split.append((job, reqs, results[offset : offset + len(reqs)]))
        offset += len(reqs)
    return split


def run_work_items(rt: WorkerRuntime, work_ids: list[int]) -> dict[int, WorkOutcome]:
    """Do (the rest of) several work items together; safe to call twice for the same ids.

    Each step asks every trajectory's budget policy what to sample next and sends all of it
    to the engine in one ``generate`` call per backend (more sequences per call, and the
    engine's prefix cache sees every prefix together), then commits each trajectory's batch
    in its own transaction, with "done" in the last one.  A failure fails only the item it
    belongs to.  While this runs, the runtime's heartbeat keeps the leases alive.
    """
    outcomes: dict[int, WorkOutcome] = {}
    claimed: list[int] = []
    with (
        rt.held.holding(ROLLOUT_WORK, work_ids),
        bind(worker=rt.name, item=work_ids[0] if len(work_ids) == 1 else work_ids),
    ):
        try:
            return _run(rt, work_ids, outcomes, claimed)
        except BaseException as exc:
            # whatever escaped (a database error loading the next item, a bug, SystemExit):
            # what this task claimed and did not finish goes back, with the error counted
            unsettled = [w for w in claimed if w not in outcomes]
            queue.release_unfinished(rt.db, ROLLOUT_WORK, unsettled, rt.name, exc, rt.retry, rt.held)
            raise


def _run(
    rt: WorkerRuntime, work_ids: list[int], outcomes: dict[int, WorkOutcome], claimed: list[int]
) -> dict[int, WorkOutcome]:
    active: list[TrajectoryJob] = []
    contexts: dict[int, queries.WorkContext] = {}
    if not rt.stopping.is_set():  # else none is claimed: the dispatcher publishes them again
        with rt.db.session() as s:  # one transaction claims the message's jobs...
            claimed.extend(w for w in work_ids if jobs.claim(s, ROLLOUT_WORK, w, rt.name, rt.options.lease_ttl_s))
    if claimed:  # ...and, once that committed (an error loading them counts an attempt), one loads them
        with rt.db.session() as s:
            trajectory_of = queries.work_trajectories(s, claimed)
            loaded = queries.load_work_contexts(s, list(trajectory_of.values()))
        contexts = {w: loaded[trajectory_of[w]] for w in claimed}
    for work_id in work_ids:
        if work_id not in contexts:
            outcomes[work_id] = WorkOutcome("skipped")
            continue
        try:
            active.append(TrajectoryJob(rt, work_id, contexts[work_id]))
        except Exception as exc:
            outcomes[work_id] = WorkOutcome(_fail(rt, work_id, exc))
    while active:
        if rt.stopping.is_set():
            _hand_back(rt, active, outcomes)
            break
        groups: dict[tuple[int, SamplingParams], list[tuple[TrajectoryJob, list[GenerationRequest]]]] = {}
        for job in active:
            try:
                groups.setdefault((id(job.backend), job.params), []).append((job, job.next_requests()))
            except Exception as exc:
                outcomes[job.work_id] = WorkOutcome(_fail(rt, job.work_id, exc, job.set_name))
        still: list[TrajectoryJob] = []
        for (_, params), members in groups.items():
            started = time.monotonic()
            with rt.deadline(f"generate ({len(members)} trajectories)"):
                generated = _engine_call_isolated(members[0][0].backend, members, params)
            rt.engine_s += time.monotonic() - started
            for job, reqs, result in generated:
                if rt.writer is not None and not isinstance(result, Exception) and job.last_batch:
                    rt.writer.submit(ROLLOUT_WORK, job.work_id, partial(_commit_last_batch, job, reqs, result))
                    outcomes[job.work_id] = WorkOutcome("writing")
                    continue
                try:
                    if isinstance(result, Exception):
                        raise result
                    if job.write(reqs, result):
                        outcomes[job.work_id] = WorkOutcome("done")
                    else:
                        still.append(job)
                except LeaseLost as exc:
                    log.warning("%s", exc)
                    outcomes[job.work_id] = WorkOutcome("lost")
                except Exception as exc:
                    outcomes[job.work_id] = WorkOutcome(_fail(rt, job.work_id, exc, job.set_name))
        active = still
    return outcomes


def _commit_last_batch(job: TrajectoryJob, requests: list[GenerationRequest], results: list[list[Completion]]) -> None:
    """On the write-behind thread: commit a trajectory's last batch and settle its job."""
    rt = job.rt
    try:
        if not job.write(requests, results):  # cannot happen while asks_once holds; never strand it
            log.warning("work item %s is not done after its last batch; handing it back", job.work_id)
            queue.hand_back(rt.db, {ROLLOUT_WORK: [job.work_id]}, rt.name)
    except LeaseLost as exc:
        log.warning("%s", exc)
    except Exception as exc:
        _fail(rt, job.work_id, exc, job.set_name)


def _hand_back(rt: WorkerRuntime, trajectories: list[TrajectoryJob], outcomes: dict[int, WorkOutcome]) -> None:
    """The worker is stopping: return the items it holds (their committed batches stay)."""
    queue.hand_back(rt.db, {ROLLOUT_WORK: [job.work_id for job in trajectories]}, rt.name)
    for job in trajectories:
        outcomes[job.work_id] = WorkOutcome("handed-back")
    log.info("stopping: handed back %d work items after the batch in flight", len(trajectories))


def run_work_item(rt: WorkerRuntime, work_id: int) -> WorkOutcome:
    """Do (the rest of) one work item; safe to call twice for the same id at once."""
    return run_work_items(rt, [work_id])[work_id]
