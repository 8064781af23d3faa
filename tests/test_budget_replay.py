"""The budget replay (``bench/experiments/budget_replay.py``) decides what the task code decides.

The neural budget benchmark's headline comparisons (siblings or not, the last release's
defaults) are replays of a budget on an exhaustive run's draws.  They are only worth
printing if a replay gives the labels and the rollouts an adaptive run through the task
code gives on the same set: rollout seeds depend on (set, problem, trajectory, prefix,
sample index), not on the budget, so the two must agree exactly, siblings included.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.experiments.budget_measures import count, labels
from bench.experiments.budget_replay import change_interval, load_pools, problem_of, replay
from stepq.assembly import worker_runtime
from stepq.migrations import upgrade
from stepq.models import Database
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.labelling.budget import parse_budget
from stepq.workers.labelling.labels import parse_rule


def _annotated(base: Path, tag: str, budget: str) -> Database:
    path = base.with_name(f"{tag}.db")
    shutil.copyfile(base, path)
    db = Database(f"sqlite:///{path}")
    configure_annotation(db, "s", 16, budget=budget)
    run_in_process(db, worker_runtime(db, WorkerOptions(batch_rollouts=64, name="test")))
    return db


@pytest.fixture(scope="module")
def sibling_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Database]:
    base = tmp_path_factory.mktemp("replay") / "base.db"
    upgrade(f"sqlite:///{base}")
    db = Database(f"sqlite:///{base}")
    synth_set(db, "s", problems=12, seed=5, trajectories_per_problem=4, error_rate=0.3, recovery_rate=0.05)
    db.dispose()
    runs = {tag: _annotated(base, tag, budget) for tag, budget in (("ex", "exhaustive"), ("ad", "adaptive"))}
    yield runs
    for run in runs.values():
        run.dispose()


def test_a_replay_on_exhaustive_draws_is_the_task_codes_adaptive_run(sibling_runs: dict[str, Database]) -> None:
    ex, ad = sibling_runs["ex"], sibling_runs["ad"]
    rule = parse_rule("abs-q")
    pools = load_pools(ex, per_trajectory=True)
    assert len(pools) == 48 and all(len(p.siblings) == 3 for p in pools.values())
    again = replay(pools, parse_budget("adaptive"), rule, 16)
    assert again.labels == labels(ad, "s", rule, per_trajectory=True)
    assert again.rollouts == count(ad, "s", "count(r.id)")
    assert again.tokens == count(ad, "s", "coalesce(sum(r.tokens), 0)")
    # without the siblings' outcomes the same budget must draw more: they were used
    alone = replay(pools, parse_budget("adaptive:sib=0"), rule, 16)
    assert alone.rollouts > again.rollouts


def test_several_trajectories_per_problem_are_keyed_apart(sibling_runs: dict[str, Database]) -> None:
    ex = sibling_runs["ex"]
    with pytest.raises(ValueError, match="per_trajectory"):
        load_pools(ex)
    got = labels(ex, "s", parse_rule("abs-q"), per_trajectory=True)
    assert len({key[0] for key in got}) == 48 and len({problem_of(key) for key in got}) == 12
    flipped = {key: not label for key, label in got.items()}
    low, high = change_interval(flipped, got, got)
    assert high == low == -100.0
