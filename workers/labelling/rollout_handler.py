"""The rollouts handler: for the claimed work items (each a trajectory's missing rollouts),
generate, grade, and write the rollouts with Q-values and labels in small committed batches.

The runner (``stepq.workers.jobqueue.runner``) claims and settles the items; this module only
does the work.  The same code runs in a Celery worker and in the embedded runner.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from itertools import accumulate
from typing import Any

from stepq.models import queries
from stepq.models.errors import ConfigError, GenerationError, LeaseLost, Superseded, WrongGenerator
from stepq.models.rollouts import Rollout
from stepq.models.work import ROLLOUT_WORK
from stepq.workers.backends import (
    Completion,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
    expected_generator,
    generator_id,
    serves_model,
)
from stepq.workers.jobqueue.job_kind import JobKind
from stepq.workers.jobqueue.runner import Claimed, run_jobs
from stepq.workers.jobqueue.runtime import WorkerRuntime
from stepq.workers.labelling.budget import parse_budget
from stepq.workers.labelling.labels import parse_rule
from stepq.workers.labelling.qvalues import TrajectoryLabeller
from stepq.workers.seeds import derive_seed

log = logging.getLogger("stepq.worker")


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

    def __init__(self, claimed: Claimed, work_id: int, ctx: queries.WorkContext) -> None:
        self.claimed, self.rt, self.work_id, self.ctx = claimed, claimed.rt, work_id, ctx
        self.set_name = ctx.problem_set.name
        self.generation = ctx.problem_set.sampling_generation
        """The set's sampling as loaded: a resample since voids this job's batches (the fence)."""
        pset, traj, problem = ctx.problem_set, ctx.trajectory, ctx.problem
        if not problem.reference_answer:
            raise ConfigError(f"problem {problem.external_id} has no reference answer to grade against")
        self.policy = parse_budget(pset.budget_policy)
        self.params = SamplingParams.from_config(pset.sampling)
        self.backend = self.rt.engines.backend_for(pset)
        self.generator = generator_id(self.backend, self.params)
        named = expected_generator(pset.backend, pset.backend_config or {}, self.backend.name)
        if named is not None and not serves_model(self.backend, named):
            raise WrongGenerator(
                f"set '{pset.name}' names {named}; this worker generates with {self.backend.generator}"
            )
        if pset.generator is not None and pset.generator != self.generator:
            raise WrongGenerator(queries.wrong_generator(pset.name, pset.generator, self.generator))
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
        # The whole text once and where each prefix ends: every prefix as its own string grew
        # with the square of the steps (a 10,000-step trajectory took 2.3 GB); a batch's
        # contexts are cut from it when asked.
        self.text = traj.prompt + "".join(chunk.text for chunk in ctx.chunks)
        self.ends = list(accumulate((len(c.text) for c in ctx.chunks), initial=len(traj.prompt)))
        self.decision = self.labeller.decide(ctx.rewards)
        self.batch: list[tuple[int, list[int]]] = []
        self.first = True

    @property
    def last_batch(self) -> bool:
        """This batch surely finishes the trajectory: its budget asks once and the batch
        serves every request (so nothing waits on what it says)."""
        asked = sum(len(js) for js in self.decision.requests.values())
        return self.policy.asks_once and sum(len(js) for _, js in self.batch) == asked

    def prefix(self, k: int) -> str:
        """The prompt and the first ``k`` chunks."""
        return self.text[: self.ends[k]]

    def next_requests(self) -> list[GenerationRequest]:
        """The next batch: the whole round when it fits, so a crash never splits one."""
        self.batch = next_batch(self.decision.requests, self.rt.options.batch_rollouts)
        if not self.batch and not self.decision.done:
            raise RuntimeError(f"budget policy {self.policy.spec} asked for nothing new yet is not done")
        pset, problem, traj = self.ctx.problem_set, self.ctx.problem, self.ctx.trajectory
        return [
            GenerationRequest(
                self.prefix(k),
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
                grade = rt.engines.grader.grade(comp.text, self.ctx.problem.reference_answer)
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
            # the fence first: the set's row before any other (a resample takes it first too,
            # so the two never wait on each other in a circle)...
            queries.fence_write(s, self.ctx.problem_set.id, self.generation, self.generator)
            self.claimed.renew(s, self.work_id)
            queries.insert_ignore(s, Rollout, rows)
            if self.first:
                queries.mark_trajectory_counted(s, traj.id, self.labeller.trajectory_is_sample)
                self.first = False
            self.decision = self.labeller.refresh(s)
            rt.heartbeat.write(s, rollouts=len(rows), tokens=tokens)
            # ...and again last where the first read held no lock (SQLite)
            queries.fence_write(s, self.ctx.problem_set.id, self.generation, self.generator, recheck=True)
            if self.decision.done:  # the last batch commits together with "done"
                self.claimed.finish(s, self.work_id)
        return self.decision.done


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


def handle_rollouts(rt: WorkerRuntime, claimed: Claimed) -> None:
    """Do (the rest of) the claimed work items together.

    Each step asks every trajectory's budget policy what to sample next and sends all of it
    to the engine in one ``generate`` call per backend (more sequences per call, and the
    engine's prefix cache sees every prefix together), then commits each trajectory's batch
    in its own transaction, with "done" in the last one.  A failure fails only the item it
    belongs to.  Stopping, it returns after the batch in flight (the runner hands the rest
    back; their committed batches stay).
    """
    with rt.db.session() as s:  # an error loading them counts an attempt (the runner fails them)
        trajectory_of = queries.work_trajectories(s, claimed.ids)
        loaded = queries.load_work_contexts(s, list(trajectory_of.values()))
    active: list[TrajectoryJob] = []
    for work_id in claimed.ids:
        try:
            active.append(TrajectoryJob(claimed, work_id, loaded[trajectory_of[work_id]]))
        except WrongGenerator as exc:
            _refuse(rt, claimed, work_id, exc)
        except Exception as exc:
            claimed.fail(work_id, exc)
    while active and not claimed.stopping:
        groups: dict[tuple[int, SamplingParams], list[tuple[TrajectoryJob, list[GenerationRequest]]]] = {}
        for job in active:
            try:
                groups.setdefault((id(job.backend), job.params), []).append((job, job.next_requests()))
            except Exception as exc:
                claimed.fail(job.work_id, exc, set=job.set_name)
        still: list[TrajectoryJob] = []
        for (_, params), members in groups.items():
            started = time.monotonic()
            with rt.deadline(f"generate ({len(members)} trajectories)"):
                generated = _engine_call_isolated(members[0][0].backend, members, params)
            rt.engine_s += time.monotonic() - started
            for job, reqs, result in generated:
                if rt.writer is not None and not isinstance(result, Exception) and job.last_batch:
                    rt.writer.submit(claimed.kind, job.work_id, partial(_commit_last_batch, job, reqs, result))
                    claimed.record(job.work_id, "writing")
                    continue
                try:
                    if isinstance(result, Exception):
                        raise result
                    if job.write(reqs, result):
                        claimed.record(job.work_id, "done")
                    else:
                        still.append(job)
                except Exception as exc:
                    _settle_failed_write(job, exc)
        active = still


def _settle_failed_write(job: TrajectoryJob, exc: Exception) -> None:
    """A batch that was not written: its lease lost (another worker has the item), the set
    resampled meanwhile (sampled again the new way, no attempt spent), the set pinned to another
    generator (refused), or an error of its own (an attempt counted)."""
    if isinstance(exc, LeaseLost):
        log.warning("%s", exc)
        job.claimed.record(job.work_id, "lost")
    elif isinstance(exc, Superseded):
        log.info("work item %s: %s; handing it back", job.work_id, exc)
        job.claimed.hand_back(job.work_id)
    elif isinstance(exc, WrongGenerator):
        _refuse(job.rt, job.claimed, job.work_id, exc)
    else:
        job.claimed.fail(job.work_id, exc, set=job.set_name)


def _refuse(rt: WorkerRuntime, claimed: Claimed, work_id: int, exc: WrongGenerator) -> None:
    """Work of a set another generator samples: back, unharmed, for a worker that matches (a
    fleet worker), the refusal logged and shown in ``stepq status`` (its heartbeat); alone, the
    item fails for good with the reason (nobody else would take it)."""
    rt.refused = str(exc)
    if rt.options.hands_back_refused:
        log.warning("work item %s refused: %s", work_id, exc)
        claimed.hand_back(work_id)
    else:
        claimed.fail(work_id, exc)


def _commit_last_batch(job: TrajectoryJob, requests: list[GenerationRequest], results: list[list[Completion]]) -> None:
    """On the write-behind thread: commit a trajectory's last batch and settle its job."""
    try:
        if not job.write(requests, results):  # cannot happen while asks_once holds; never strand it
            log.warning("work item %s is not done after its last batch; handing it back", job.work_id)
            job.claimed.hand_back(job.work_id)
    except Exception as exc:
        _settle_failed_write(job, exc)


ROLLOUTS = JobKind(
    ROLLOUT_WORK,
    "stepq.annotate_trajectory",
    handle_rollouts,
    plan=queries.plan_work,  # work for new trajectories and raised budgets
    held_back=queries.sets_being_scored,
)
"""A trajectory's missing rollouts; several to a message (one engine call serves them, the
settings' ``items_per_task``).  Planned each cycle for new trajectories and raised budgets;
a prioritised set's wait while a round scores them."""


def run_work_items(rt: WorkerRuntime, work_ids: list[int], kind: JobKind = ROLLOUTS) -> dict[int, WorkOutcome]:
    """Run rollout work items here (the runner and this handler); safe to call twice."""
    return {i: WorkOutcome(status) for i, status in run_jobs(rt, kind, work_ids).items()}


def run_work_item(rt: WorkerRuntime, work_id: int, kind: JobKind = ROLLOUTS) -> WorkOutcome:
    """Do (the rest of) one work item; safe to call twice for the same id at once."""
    return run_work_items(rt, [work_id], kind)[work_id]
