"""A training method added from outside stepq: one module and one registry line (an entry
point of the ``stepq.methods`` group), trained by ``stepq train`` and by the trainer service
through the same executor as the shipped methods: recorded, leased, checkpointed, resumable.

The toy method learns the base rate of a snapshot's training labels (one logit, by gradient
descent on the mean cross-entropy): small enough to train in a second, and wrong in a way
the test sees if the executor fed it the wrong split or lost its steps."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.trainer import methods
from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot
from tests.helpers import annotated_set, clean_env

TOY_MODULE = '''
"""The base rate of a snapshot's training labels, as a stepq training method."""

import json
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from stepq.models import queries
from stepq.trainer.methods.base import Method, base_model
from stepq.trainer.training.runs import RunPlan, RunSpec


@dataclass(frozen=True)
class ToyConfig:
    steps: int = 40
    learning_rate: float = 2.0
    save_steps: int = 10


class ToyTrainer:
    processing_class = None

    def __init__(self, labels, args, output_dir, callbacks=()):
        self.labels, self.config, self.output_dir, self.callbacks = labels, args, Path(output_dir), callbacks
        self.state = SimpleNamespace(global_step=0, max_steps=args.steps)
        self.logit = 0.0

    def _hook(self, name, **kw):
        for callback in self.callbacks:
            getattr(callback, name)(SimpleNamespace(output_dir=str(self.output_dir)), self.state, None, **kw)

    def train(self, resume_from_checkpoint=None):
        if resume_from_checkpoint:
            saved = json.loads((Path(resume_from_checkpoint) / "toy.json").read_text())
            self.logit, self.state.global_step = saved["logit"], saved["step"]
        self._hook("on_train_begin")
        rate = sum(self.labels) / len(self.labels)
        while self.state.global_step < self.config.steps:
            p = 1 / (1 + math.exp(-self.logit))
            self.logit -= self.config.learning_rate * (p - rate)
            self.state.global_step += 1
            self._hook("on_step_end")
            loss = -(rate * math.log(p) + (1 - rate) * math.log(1 - p))
            self._hook("on_log", logs={"loss": loss})
            if self.state.global_step % self.config.save_steps == 0:
                self.save_model(self.output_dir / f"checkpoint-{self.state.global_step}")
                self._hook("on_save")

    def save_model(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        document = {"logit": self.logit, "step": self.state.global_step, "labels": len(self.labels)}
        (Path(path) / "toy.json").write_text(json.dumps(document))


class Toy(Method):
    name = "toy"
    recipe = "toy.yaml"
    summary = "the base rate of a snapshot's labels"
    trains_on_snapshots = True

    def plan(self, db, recipe, data, output_dir, options):
        snapshot = data.snapshot_id(db)
        with db.session() as session:
            labels = [r.positive for r in queries.snapshot_rows(session, snapshot, "train")]
        config = recipe.config(ToyConfig, **(options.trainer_overrides or {}))
        model = base_model(recipe, options)
        return RunPlan(
            RunSpec(self.name, recipe.text, model, output_dir, snapshot_id=snapshot),
            ToyTrainer,
            {"labels": labels, "args": config, "output_dir": output_dir},
            max_steps=config.steps,
            side_files={"toy-method.json": {"labels": "train split"}},
        )
'''


def install_toy_method(site: Path) -> Path:
    """The method's module and its one registry line (the entry point), as a package of its
    own installs them: on the path, found by ``importlib.metadata``."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "toy_method.py").write_text(TOY_MODULE, encoding="utf-8")
    info = site / "toy_method-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-method\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[stepq.methods]\ntoy = toy_method:Toy\n", encoding="utf-8")
    return site


def _train_rate(db: Database, snapshot: int) -> float:
    with db.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT positive FROM snapshot_rows WHERE snapshot_id = :s AND split = 'train'"), {"s": snapshot}
        ).all()
    return sum(bool(r.positive) for r in rows) / len(rows)


def _learnt_rate(folder: Path) -> float:
    return 1 / (1 + math.exp(-json.loads((folder / "toy.json").read_text())["logit"]))


def test_a_method_from_its_own_package_trains_through_stepq_train_and_the_service(
    pg: Database, pg_url: str, tmp_path: Path
) -> None:
    annotated_set(pg, problems=24, error_rate=0.3, recovery_rate=0.0)
    # unbalanced, so the two splits' base rates differ: a method fed the wrong split learns the wrong rate
    snapshot = create_snapshot(pg, SnapshotSpec(("s",), "abs-q", val_fraction=0.4, seed=0, balanced=False))
    with pg.engine.connect() as conn:
        rates = dict(
            conn.execute(
                text(
                    "SELECT split, avg(CASE WHEN positive THEN 1.0 ELSE 0.0 END) FROM snapshot_rows "
                    "WHERE snapshot_id = :s GROUP BY split"
                ),
                {"s": snapshot},
            ).all()
        )
    assert abs(float(rates["train"]) - float(rates["validation"])) > 0.01, rates
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # what a base model folder must hold
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(f"method: toy\nmodel: {model}\ntrainer:\n  steps: 40\n  save_steps: 10\n")
    site = install_toy_method(tmp_path / "site")
    env = clean_env(STEPQ_DATABASE_URL=pg_url, PYTHONPATH=str(site))

    def stepq(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "stepq", *args]
        return subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    listed = stepq("train", "--help")
    assert "toy" in listed.stdout, "an installed method is one of --method's choices"
    out = tmp_path / "toy-run"
    done = stepq("train", "--method", "toy", "--snapshot", str(snapshot), "--recipe", str(recipe), "--output", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "done at step 40" in done.stdout
    assert _learnt_rate(out / "final") == pytest.approx(_train_rate(pg, snapshot), abs=1e-3)
    assert json.loads((out / "final" / "toy-method.json").read_text())["source"].startswith("training run ")
    with pg.session() as s:
        row = queries.run_by_output(s, str(out.resolve()))
        assert row is not None
        assert (row.method, row.snapshot_id, row.status, row.global_step) == ("toy", snapshot, "done", 40)
        assert [Path(c).name for c in row.checkpoints] == [f"checkpoint-{n}" for n in (10, 20, 30, 40)]
        assert len(queries.run_metrics(s, row.id)) == 40

    # the service trains a lineage with it: its own balanced snapshot, then the toy run on it
    served = stepq(
        "trainer", "serve", "--lineage", "toys", "--sets", "s", "--recipe", str(recipe), "--min-new-chunks", "1",
        "--output-root", str(tmp_path / "runs"), "--poll", "0.2", "--max-trainings", "1", "--val-fraction", "0.3",
    )  # fmt: skip
    assert served.returncode == 0, served.stderr[-2000:]
    with pg.session() as s:
        (lineage_run,) = queries.lineage_runs(s, "toys")
        assert (lineage_run.method, lineage_run.status) == ("toy", "done")
        assert lineage_run.snapshot_id not in (None, snapshot)
        served_snapshot = lineage_run.snapshot_id
    final = Path(lineage_run.output_dir) / "final"
    assert _learnt_rate(final) == pytest.approx(_train_rate(pg, served_snapshot), abs=1e-3)


def test_an_unknown_method_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"unknown training method 'nope'.*grpo, dpo, prm"):
        methods.method_named("nope")
    with pytest.raises(ConfigError, match="unknown training method 'nope'"):
        methods.recipe_for(None, None, ("method=nope",))
