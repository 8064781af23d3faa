"""The active-learning loop in the trainer service: each judge the lineage trains re-orders the
sets that follow it (a new priority round, recorded with the run and what the set had spent),
and the generative judge scores the waiting trajectories by its verdicts' split over K votes
(real GRPO training and hf generation on a tiny model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from stepq.assembly import worker_runtime
from stepq.models import Database, PriorityRound, RolloutWork, queries
from stepq.trainer.service import ServiceOptions, serve
from stepq.trainer.tiny_model import build_tiny_model
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.kinds import SCORINGS
from tests.helpers import annotated_set
from tests.trainer_helpers import prm_recipe, tiny_recipe

pytestmark = pytest.mark.slow


def _label(db: Database, problems: int) -> None:
    annotated_set(
        db,
        "s",
        m=4,
        problems=problems,
        seed=1,
        error_rate=0.25,
        recovery_rate=0.0,
        worker="annotator",
        batch_rollouts=64,
    )


def _one_training(lineage: str, recipe: Path, tmp_path: Path) -> ServiceOptions:
    """The service for one training of ``lineage`` once 10 chunks are labelled, then it returns."""
    return ServiceOptions(
        lineage=lineage,
        recipe=str(recipe),
        output_root=tmp_path / "runs",
        sets=("s",),
        min_new_chunks=10,
        val_fraction=0.2,
        poll_s=0.1,
        max_trainings=1,
        max_idle_s=5,
    )


def _scored(pg: Database, pool_id: int) -> list[Any]:
    """The pool released and its scoring jobs run by a worker: each item's (priority, round)."""
    with pg.session() as s:
        queries.pause_set(s, "pool", False)
    run_in_process(pg, worker_runtime(pg, WorkerOptions(name="scorer")), kinds=[SCORINGS])
    with pg.session() as s:
        query = select(RolloutWork.priority, RolloutWork.priority_round_id)
        return list(s.execute(query.where(RolloutWork.problem_set_id == pool_id)).all())


def test_each_new_judge_of_the_lineage_reorders_the_sets_that_follow_it(pg: Database, tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model")
    options = _one_training("judge", tiny_recipe(tmp_path / "tiny.yaml", model, max_steps=2, save_steps=2), tmp_path)
    said: list[str] = []
    _label(pg, 12)
    assert serve(pg, options, said.append) == 1
    with pg.session() as s:
        (first_run,) = queries.lineage_runs(s, "judge")
    assert not any("priority round" in line for line in said), "no set follows the lineage yet"

    synth_set(pg, "pool", problems=6, seed=2, error_rate=0.3)
    with pg.session() as s:
        queries.pause_set(s, "pool", True)  # its rollouts wait while the lineage trains
    report = configure_annotation(pg, "pool", 2, priority="uncertainty:lineage=judge,votes=2").ordered
    assert report is not None and report.judge_run_id == first_run.id

    _label(pg, 30)  # new labels: the service trains the lineage's next judge
    assert serve(pg, options, said.append) == 1
    with pg.session() as s:
        runs = queries.lineage_runs(s, "judge")
        rounds = list(s.scalars(select(PriorityRound).order_by(PriorityRound.id)))
        pool_id = queries.get_set(s, "pool").id
        labelled = queries.count_labelled(s, [pool_id], "abs-q")
    assert [r.status for r in runs] == ["done", "done"]
    assert [(r.strategy, r.judge_run_id) for r in rounds] == [
        ("uncertainty:lineage=judge,votes=2", first_run.id),
        ("uncertainty:lineage=judge,votes=2", runs[1].id),
    ]
    assert rounds[1].labelled_before == labelled and rounds[1].details["judge_method"] == "grpo"
    assert any(f"priority round {rounds[1].id}" in line for line in said)

    placed = _scored(pg, pool_id)
    assert len(placed) == 6 and {r for _, r in placed} == {rounds[1].id}, "the newer judge placed every item"
    # two votes per chunk: P(Positive) is 0, 0.5 or 1, so a trajectory's uncertainty is 0 or 1
    assert {p for p, _ in placed} <= {0.0, 1.0}


def test_a_step_label_prm_lineage_trains_through_the_service_and_orders_a_set(pg: Database, tmp_path: Path) -> None:
    """The service trains whichever method its recipe names: here the step-label PRM, whose
    second judge continues the first (backbone and head), and a worker scores the waiting
    trajectories with it through the same judge factory."""
    model = build_tiny_model(tmp_path / "model", n_positions=512)
    recipe = tmp_path / "prm.yaml"
    recipe.write_text(prm_recipe(model, max_steps=2, save_steps=2).text)
    options = _one_training("steps", recipe, tmp_path)
    said: list[str] = []
    _label(pg, 12)
    assert serve(pg, options, said.append) == 1
    synth_set(pg, "pool", problems=6, seed=2, error_rate=0.3)
    with pg.session() as s:
        queries.pause_set(s, "pool", True)
    configure_annotation(pg, "pool", 2, priority="uncertainty:lineage=steps")
    _label(pg, 30)
    assert serve(pg, options, said.append) == 1
    with pg.session() as s:
        first, second = queries.lineage_runs(s, "steps")
        rounds = list(s.scalars(select(PriorityRound).order_by(PriorityRound.id)))
        pool_id = queries.get_set(s, "pool").id
    assert (first.method, second.method) == ("prm", "prm") and second.snapshot_id != first.snapshot_id
    assert second.base_model == str(Path(first.output_dir) / "final"), "the lineage continues its judge"
    assert rounds[-1].judge_run_id == second.id and rounds[-1].details["judge_method"] == "prm"
    placed = _scored(pg, pool_id)
    assert len(placed) == 6 and {r for _, r in placed} == {rounds[-1].id}, "the PRM placed every item"
    assert all(p is not None and 0.0 <= p <= 1.0 for p, _ in placed)
