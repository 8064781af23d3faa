"""Create a synthetic problem set: problems plus policy trajectories with known truth."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.models.problems import Problem
from stepq.workers.backends import SamplingParams, generator_id
from stepq.workers.backends.synthetic import SyntheticBackend
from stepq.workers.backends.synthetic_policy import (
    DEFAULT_NUMBERS,
    PROMPT_TEMPLATE,
    SMALL_NUMBERS,
    ArithmeticProblem,
    SyntheticPolicy,
    ground_truth,
    make_problem,
    parse_problem,
    trajectory_q,
)
from stepq.workers.data.segmentation import segment
from stepq.workers.labelling.labels import label_chunks
from stepq.workers.seeds import derive_seed


@dataclass(frozen=True)
class SynthReport:
    new_problems: int
    new_trajectories: int


def _describe(backend: str, seed: int, config: Mapping[str, Any]) -> str:
    if backend != "synthetic":
        return f"the {backend} backend (not a synthetic set)"
    settings = ", ".join(f"{k}={config.get(k)}" for k in ("error_rate", "recovery_rate", "latency_s"))
    return f"seed {seed} ({settings})"


NUMBERS = {"default": DEFAULT_NUMBERS, "small": SMALL_NUMBERS}
"""``small``: one-digit additions and subtractions from a two-digit start, so one digit of
arithmetic checks a step (``synthetic_policy.SMALL_NUMBERS``)."""


def set_problems(seed: int, count: int, numbers: str = "default") -> list[tuple[str, ArithmeticProblem]]:
    """The first ``count`` problems of a synthetic set of ``seed`` with their external ids: what
    ``synth_set`` inserts, drawn without a database (a benchmark's exclusions read them)."""
    drawn_from = NUMBERS[numbers]
    return [
        (f"synth-{seed}-{i}", make_problem(derive_seed("problem", seed, i), numbers=drawn_from)) for i in range(count)
    ]


def synth_set(
    db: Database,
    set_name: str,
    *,
    problems: int,
    seed: int = 0,
    trajectories_per_problem: int = 1,
    error_rate: float = 0.1,
    recovery_rate: float = 0.001,
    latency_s: float = 0.0,
    op_error_rates: dict[str, float] | None = None,
    slip_rate: float = 0.0,
    numbers: str = "default",
    step_separator: str = "\n\n",
    error_kinds: dict[str, float] | None = None,
) -> SynthReport:
    """Idempotent: the same arguments give the same rows; more problems add only the new."""
    config: dict[str, Any] = {"error_rate": error_rate, "recovery_rate": recovery_rate, "latency_s": latency_s}
    if op_error_rates:
        config["op_error_rates"] = dict(op_error_rates)
    if slip_rate:
        config["slip_rate"] = slip_rate
    if error_kinds:  # what an error is (the step's own result off, by default)
        config["error_kinds"] = dict(error_kinds)
    if step_separator != "\n\n":  # one line a step, as a policy asked for "Step n:" lines writes
        config["step_separator"] = step_separator
    if numbers != "default":  # the problems' numbers (the policy reads them from the text)
        if numbers not in NUMBERS:
            raise ConfigError(f"unknown numbers '{numbers}' (one of: {', '.join(NUMBERS)})")
        config["numbers"] = numbers
    policy = SyntheticBackend.from_config(config).policy
    # The trajectories are drawn exactly as the backend draws rollouts, so they are
    # samples of the same distribution (the adaptive budget counts them as such).
    generator = generator_id(SyntheticBackend.from_config(config), SamplingParams())
    new_p = new_t = 0
    with db.session() as s:
        pset = queries.ensure_set(s, set_name, backend="synthetic", backend_config=config, seed=seed)
        stored = dict(pset.backend_config or {})
        if (pset.backend, pset.seed) != ("synthetic", seed) or (
            pset.backend == "synthetic" and {k: stored.get(k) for k in {*config, *stored}} != config
        ):
            raise ConfigError(
                f"set '{set_name}' exists with {_describe(pset.backend, pset.seed, pset.backend_config)}; "
                f"'stepq synth' would add problems of {_describe('synthetic', seed, config)}: "
                "use the same settings to grow it, or another --set"
            )
        specs = set_problems(seed, problems, numbers)
        new_p = queries.insert_ignore(
            s,
            Problem,
            [
                {
                    "problem_set_id": pset.id,
                    "external_id": ext,
                    "question": p.question,
                    "reference_answer": str(p.answer),
                    "meta": {"steps": len(p.ops)},
                }
                for ext, p in specs
            ],
        )
        ids = queries.existing_problem_ids(s, pset.id, [ext for ext, _ in specs])
        for ext, problem in specs:
            for t in range(trajectories_per_problem):
                traj_seed = derive_seed("trajectory", seed, ext, t)
                steps = policy.solve(problem, traj_seed)
                text = "".join(st.text for st in steps)
                seg = segment(text, "step-markers")
                assert len(seg.chunks) == len(steps)
                truth = ground_truth(steps)
                tid = queries.add_trajectory(
                    s,
                    {
                        "problem_id": ids[ext],
                        "source_key": f"policy:{t}",
                        "prompt": PROMPT_TEMPLATE.format(question=problem.question),
                        "text": text,
                        "final_answer": str(steps[-1].value),
                        "outcome": steps[-1].value == problem.answer,
                        "n_chunks": len(steps),
                        "segmentation": seg.method,
                        "generator": generator,
                        "seed": traj_seed,
                    },
                    [
                        {"idx": i + 1, "text": c, "ground_truth": g}
                        for i, (c, g) in enumerate(zip(seg.chunks, truth, strict=True))
                    ],
                )
                new_t += tid is not None
    return SynthReport(new_p, new_t)


def exact_labels(policy: SyntheticPolicy, prompt: str, seed: int, rule: Any) -> list[bool | None]:
    """The true labels of a synthetic trajectory under a rule: the rule on its exact Q-values
    (the trajectory re-drawn from its prompt and seed)."""
    problem = parse_problem(prompt)
    steps = policy.continue_steps(problem, 0, problem.start, random.Random(seed))
    return label_chunks(rule, trajectory_q(policy, problem, steps))
