"""The trainer service as an operator meets it: what it refuses at its start, and why it
waits, said once per change (a lineage whose rule its sets hold no labels under waited for ever,
saying "nothing to train")."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepq.assembly import worker_runtime
from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.trainer.service import ServiceOptions, serve
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions


def _options(tmp_path: Path, recipe: str, processes: int = 1, rule: str = "abs-q") -> ServiceOptions:
    return ServiceOptions(
        "l", recipe, tmp_path, ("demo",), rule=rule, processes=processes, poll_s=0.05, max_trainings=1, max_idle_s=0.5
    )


def test_the_service_refuses_what_a_method_cannot_train(sqlite: Database, tmp_path: Path) -> None:
    """Said at the start, not by a launch that fails every cycle: a method that does not train
    on snapshots has no lineage, and the PRM's trainer runs in one process."""
    with pytest.raises(ConfigError, match="'dpo' does not train on a snapshot"):
        serve(sqlite, _options(tmp_path, "step-dpo.yaml"))
    with pytest.raises(ConfigError, match="'prm' trains in one process"):
        serve(sqlite, _options(tmp_path, "outcome-prm.yaml", processes=2))
    with sqlite.session() as s:
        assert queries.lock_holder(s, "trainer:l") is None, "refused before taking the lineage's lease"


def test_the_service_says_why_it_waits_once_per_change(sqlite: Database, tmp_path: Path) -> None:
    synth_set(sqlite, "demo", problems=6, seed=1)
    configure_annotation(sqlite, "demo", 2, rule="rel-effective:alpha=0.4")
    run_in_process(sqlite, worker_runtime(sqlite, WorkerOptions(name="annotator")))
    said: list[str] = []
    assert serve(sqlite, _options(tmp_path, "stepwiser-judge.yaml"), said.append) == 0
    wrong_rule = "lineage 'l' (rule abs-q): no chunk of its sets is labelled under this rule; sets labelled "
    assert said == [wrong_rule + "rel-effective:alpha=0.4: demo", "nothing to train; exiting (idle limit)"]

    said.clear()  # the lineage's own rule, too few labels for a snapshot
    options = _options(tmp_path, "stepwiser-judge.yaml", rule="rel-effective:alpha=0.4")
    assert serve(sqlite, options, said.append) == 0
    waits = "lineage 'l' (rule rel-effective:alpha=0.4): waiting for 1000 new labelled chunks for its first snapshot"
    assert said == [waits, "nothing to train; exiting (idle limit)"]
