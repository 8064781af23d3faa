"""What a round of bench_active labelled (``bench/experiments/active_picks.py``): the figures
that say why an ordering pays or does not, on hand-checked trajectories and on a real pool."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select

from bench.experiments.active_picks import describe, round_picks
from stepq.assembly import worker_runtime
from stepq.migrations import upgrade
from stepq.models import Database, Rollout
from stepq.models.trajectories import Chunk
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions


@pytest.mark.unit
def test_the_picks_figures_on_hand_checked_trajectories() -> None:
    picked = {
        # right throughout, right answer; the second chunk's label is wrong (noise)
        1: {"outcome": True, "chunks": [(1, True, True), (2, True, False), (3, True, True)]},
        # first wrong step 2; chunk 3 is a dead prefix (labelled positive: noise), chunk 2 labelled right
        2: {"outcome": False, "chunks": [(1, True, True), (2, False, False), (3, False, True)]},
        # first wrong step 1: chunks 2 and 3 dead; every label agrees with the truth
        3: {"outcome": False, "chunks": [(1, False, False), (2, False, False), (3, False, False)]},
        # right answer after a recovered error at step 3 (a chunk without truth does not count)
        4: {"outcome": True, "chunks": [(1, True, True), (2, None, True), (3, False, True)]},
    }
    got = describe(picked)
    assert got["trajectories"] == 4
    assert got["wrong_answer_share"] == pytest.approx(2 / 4)
    assert got["with_error_share"] == pytest.approx(3 / 4)
    assert got["mean_first_error_step"] == pytest.approx((2 + 1 + 3) / 3)
    # 11 chunks with truth; dead: trajectory 2's third, trajectory 3's second and third
    assert got["dead_prefix_share"] == pytest.approx(3 / 11)
    # noisy: trajectory 1's second, trajectory 2's third, trajectory 4's third
    assert got["label_noise"] == pytest.approx(3 / 11)


@pytest.mark.unit
def test_no_picks_average_to_nothing() -> None:
    assert describe({}) == {
        "trajectories": 0,
        "wrong_answer_share": None,
        "with_error_share": None,
        "mean_first_error_step": None,
        "dead_prefix_share": None,
        "label_noise": None,
    }


def test_a_round_counts_only_what_it_labelled(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pool.db'}"
    upgrade(url)
    db = Database(url)
    synth_set(db, "pool", problems=40, seed=3, error_rate=0.3, recovery_rate=0.1, numbers="small")
    configure_annotation(db, "pool", 2, priority="random:seed=0")
    runtime = worker_runtime(db, WorkerOptions(batch_rollouts=16, name="test"))

    def spent() -> int:
        with db.session() as s:
            return int(s.scalar(select(func.count(Rollout.id))) or 0)

    try:
        run_in_process(db, runtime, stop=lambda: spent() >= 60)
        first, seen = round_picks(db, set())
        run_in_process(db, runtime, stop=lambda: spent() >= 120)
        second, now = round_picks(db, seen)
    finally:
        runtime.close()
    assert first["trajectories"] == len(seen) > 0
    assert second["trajectories"] == len(now) - len(seen) > 0
    assert seen < now
    # the pool's truth: the figures read the chunks' ground truth, which the synthetic set stores
    with db.session() as s:
        assert s.scalar(select(func.count(Chunk.id)).where(Chunk.ground_truth.is_(False))) > 0
    assert 0 < first["with_error_share"] <= 1
    db.engine.dispose()


@pytest.mark.unit
def test_the_summary_prints_times_and_picks_and_skips_runs_saved_without_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.experiments.bench_active import show_picks, show_times

    def point(annotate: float, train: float, evaluate: float, outcome: bool) -> dict[str, object]:
        picked = describe({1: {"outcome": outcome, "chunks": [(1, True, True)]}})
        return {"annotate_s": annotate, "train_s": train, "eval_s": evaluate, "picked": picked}

    results = {"random": {0: [point(10, 20, 10, False)]}, "uncertainty": {0: [point(30, 20, 10, True)]}}
    show_times(results)
    show_picks(results)
    out = capsys.readouterr().out
    # 100 s in all: annotating 40, training 40, evaluating 20
    assert "all rounds of every seed: 100 s, of which annotating 40%, training 40%, evaluating 20%" in out
    assert "random round 1:" in out and "what each round labelled" in out
    show_times({"random": {0: [{"annotate_s": 1.0}]}})  # saved before the judge's times were kept
    show_picks({"random": {0: [{"annotate_s": 1.0}]}})  # saved before the picks were recorded
    assert capsys.readouterr().out == ""


@pytest.mark.unit
def test_runs_saved_when_convincing_wrong_had_its_mirror_merge_under_the_mirrored_name(tmp_path: Path) -> None:
    """Before migration 0021 ``convincing-wrong`` had its mirror: a run saved then (no arms
    recorded) is summarised as ``convincing-wrong-mirror``, beside a newer run's plain arm."""
    import json

    from bench.experiments.bench_active import ARMS, merged_curves
    from stepq.workers.priority.strategies import parse_strategy

    old = {"curves": {"random": {"0": [{"step_auc": 0.7}]}, "convincing-wrong": {"0": [{"step_auc": 0.6}]}}}
    new = {"arms": {"convincing-wrong": "convincing-wrong"}, "curves": {"convincing-wrong": {"0": [{"step_auc": 0.8}]}}}
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text("a log line\n" + json.dumps(new))
    merged = merged_curves([tmp_path / "new.json", tmp_path / "old.json"])
    assert list(merged) == ["random", "convincing-wrong", "convincing-wrong-mirror"]
    assert merged["convincing-wrong"][0][0]["step_auc"] == 0.8, "the newer run's arm is the plain one"
    assert merged["convincing-wrong-mirror"][0][0]["step_auc"] == 0.6
    with pytest.raises(SystemExit, match="more than one"):
        merged_curves([tmp_path / "old.json", tmp_path / "old.json"])
    judged = {arm: spelling for arm, spelling in ARMS.items() if arm != "random"}  # random has no judge
    mirrored = {arm for arm, (name, options) in judged.items() if parse_strategy(f"{name}:run=1{options}").mirror}
    assert mirrored == {"convincing-wrong-mirror"}
