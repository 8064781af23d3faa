"""bench_active's PRM judge (``bench/experiments/active_prm.py``): the labels it trains on, and
that a round's priority scoring uses the very model the benchmark evaluated.

The benchmark's curves are only stepq's own judge at work if (1) each trajectory's steps reach
the PRM with their own Monte Carlo labels in order, after a wrong step too, and (2)
the worker's judge factory, given the round's training run, scores exactly as the trained
model did.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from bench.experiments import active_prm
from stepq.assembly import worker_runtime
from stepq.migrations import upgrade
from stepq.models import Database, queries
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Database:
    path = tmp_path_factory.mktemp("active-prm") / "set.db"
    upgrade(f"sqlite:///{path}")
    db = Database(f"sqlite:///{path}")
    synth_set(db, "s", problems=30, seed=3, error_rate=0.3, recovery_rate=0.2)
    configure_annotation(db, "s", 4)
    run_in_process(db, worker_runtime(db, WorkerOptions(batch_rollouts=64, name="test")))
    yield db
    db.dispose()


def test_each_trajectory_brings_every_label_of_its_own_in_order(labelled: Database) -> None:
    with labelled.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.trajectory_id, p.question, c.text, l.positive FROM chunk_labels l "
                "JOIN chunks c ON c.id = l.chunk_id JOIN trajectories t ON t.id = c.trajectory_id "
                "JOIN problems p ON p.id = t.problem_id ORDER BY c.trajectory_id, c.idx"
            )
        ).all()
    whole: dict[int, list[tuple[str, str, bool]]] = {}
    for tid, question, chunk, positive in rows:
        whole.setdefault(tid, []).append((question, chunk, bool(positive)))
    solutions = active_prm.labelled_solutions(labelled)
    assert len(solutions) == len(whole) == 30
    for (question, steps, labels), (_, full) in zip(solutions, sorted(whole.items()), strict=True):
        assert question == full[0][0]
        assert steps == [chunk for _, chunk, _ in full]
        assert labels == [positive for _, _, positive in full]
    # Steps after a wrong one train too (their labels say the solution is broken there).
    assert any(False in labels[:-1] for _, _, labels in solutions)


def test_the_round_scores_with_the_model_the_benchmark_trained(labelled: Database, tmp_path: Path) -> None:
    settings = active_prm.PRMSettings(width=32, layers=1, steps=5, batch_size=4)
    base = active_prm.build_backbone(tmp_path, settings, seed=0)
    solutions = active_prm.labelled_solutions(labelled)
    run_id = active_prm.round_judge(labelled, base, None, solutions, tmp_path / "r1", settings, seed=0)
    judge = active_prm.load_judge(labelled, run_id)

    from stepq.trainer.prm.model import StepScorer

    with labelled.session() as session:  # the round is a training run the executor recorded
        run = queries.get_run(session, run_id)
        assert (run.method, run.status) == ("prm", "done")
        assert run.dataset.startswith("bench-active:step-labels:")
    trained = StepScorer.load(active_prm.final_model(labelled, run_id))
    asked = [(q, steps) for q, steps, _ in solutions[:5]]
    expected = _flat(trained.score(asked))
    assert _flat(judge.score_solutions(asked)) == pytest.approx(expected)
    fresh = StepScorer.from_base(str(base), max_length=512, seed=0)
    assert _flat(fresh.score(asked)) != pytest.approx(expected)  # it trained: the weights moved

    # The same labels trained fresh again (another arm's first round, in its own database) are
    # the same run's folder: its complete checkpoint is taken, not trained again.
    other = tmp_path / "other-arm.db"
    upgrade(f"sqlite:///{other}")
    arm = Database(f"sqlite:///{other}")
    again_id = active_prm.round_judge(arm, base, None, solutions, tmp_path / "r1-again", settings, seed=0)
    again = StepScorer.load(active_prm.final_model(arm, again_id))
    assert _flat(again.score(asked)) == pytest.approx(expected)
    with arm.session() as session:
        assert queries.get_run(session, again_id).resumes == 1  # taken from the checkpoint
    arm.dispose()


def _flat(rows: list[list[float | None]]) -> list[float]:
    return [float(p) for row in rows for p in row if p is not None]
