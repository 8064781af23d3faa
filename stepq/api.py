"""stepq as a Python library: the calls ``stepq``'s own commands make, for pipelines that
script it (as users of datasets, distilabel and TRL do).

One object, ``Stepq``, holds the settings and the database and offers what the CLI can do:
ingest, synthesise, annotate, run in process, status as data, snapshots and their export,
training, evaluation.  The commands parse options, call these methods and print; so a script
gets the same checks, errors (``stepq.models.errors``, each with its exit code) and results.
Nothing here needs a private import, and the names and arguments below are the stable surface
(docs/api.md, whose examples the tests run).

    from stepq.api import Stepq

    sq = Stepq("sqlite:///demo.db")
    sq.synth("demo", problems=20, seed=1)
    sq.annotate("demo", rollouts=4)
    sq.run("demo")
    print(sq.status()["sets"][0]["done_percent"])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from stepq.models import Database
from stepq.settings import Settings

__all__ = ["Stepq", "evaluate_processbench", "tiny_model"]


class Stepq:
    """A stepq database and its settings.

    ``database_url``: a ``sqlite://`` or ``postgresql://`` URL (default: ``STEPQ_DATABASE_URL``,
    else ``stepq.db`` in the working directory); every other setting comes from the
    environment (``STEPQ_*``, docs/configuration.md) unless ``settings`` is given.  An embedded
    (SQLite) database is created and migrated on first use, as the CLI does; a PostgreSQL one
    must be migrated (``stepq db upgrade``, or ``migrate=True``)."""

    def __init__(
        self, database_url: str | None = None, *, settings: Settings | None = None, migrate: bool | None = None
    ) -> None:
        settings = settings or Settings.from_env()
        if database_url is not None:
            settings = replace(settings, database_url=database_url)
            settings.validate()
        self.settings = settings
        if migrate if migrate is not None else settings.embedded:
            from stepq.migrations import upgrade

            upgrade(settings.database_url)
        self.db = Database(settings.database_url, guards=settings.session_guards())
        self.db.check()

    # --- data ---------------------------------------------------------------------------

    def ingest(
        self,
        source: str | Path,
        set_name: str,
        *,
        hf: bool = False,
        split: str | None = None,
        hf_config: str | None = None,
        question: str | None = None,
        answer: str | None = "answer",
        answer_format: str = "auto",
        id_field: str | None = None,
        steps: str | None = None,
        outcome: str | None = None,
        first_error: str | None = None,
        update: bool = False,
    ) -> Any:
        """Add problems (and given trajectories) from a JSONL, JSON-array or Parquet file, or
        (``hf``) a Hugging Face dataset; returns the ``IngestReport``."""
        from stepq.workers.data.ingest import FieldMap, ingest_file
        from stepq.workers.data.record_files import read_dataset

        fields = FieldMap(
            question=question,
            answer=answer,
            id=id_field,
            steps=steps,
            outcome=outcome,
            first_error=first_error,
            answer_format=answer_format,
        )
        if hf:
            chosen, rows = read_dataset(str(source), split, hf_config)
            name = f"{source}[{chosen}]" if chosen else str(source)
            return ingest_file(self.db, name, set_name, fields, update=update, objects=rows)
        return ingest_file(self.db, Path(source), set_name, fields, update=update)

    def synth(self, set_name: str, problems: int, *, seed: int = 0, **policy: Any) -> Any:
        """A synthetic arithmetic set whose steps' truth is known (``policy``: the synthetic
        policy's rates, ``trajectories_per_problem``, ``numbers``, as ``stepq synth`` takes
        them); returns the ``SynthReport``."""
        from stepq.workers.data.synthetic_set import synth_set

        return synth_set(self.db, set_name, problems=problems, seed=seed, **policy)

    # --- annotation ---------------------------------------------------------------------

    def annotate(
        self,
        set_name: str,
        rollouts: int,
        *,
        rule: str | None = None,
        budget: str | None = None,
        backend: str | None = None,
        backend_config: Mapping[str, Any] | None = None,
        sampling: Mapping[str, Any] | None = None,
        resample: bool = False,
        priority: str | None = None,
        priority_aging_s: float | None = None,
    ) -> Any:
        """Plan M rollouts per prefix of every trajectory of the set (only what is missing);
        returns the ``AnnotationReport``."""
        from stepq.workers.annotation_plans import configure_annotation

        return configure_annotation(
            self.db,
            set_name,
            rollouts,
            rule=rule,
            budget=budget,
            backend=backend,
            backend_config=dict(backend_config or {}),
            sampling=dict(sampling or {}),
            resample=resample,
            priority=priority,
            priority_aging_s=priority_aging_s,
        )

    def run(
        self,
        set_name: str = "demo",
        *,
        synthetic: int | None = None,
        rollouts: int | None = None,
        seed: int = 0,
        rule: str | None = None,
        budget: str | None = None,
        echo: Callable[[str], None] = lambda _line: None,
    ) -> dict[str, Any]:
        """Annotate a set in this process, no broker or worker (what ``stepq run`` does);
        ``echo`` receives the lines the command prints.  Returns the status afterwards."""
        from stepq.embedded import run_embedded

        run_embedded(
            self.settings, set_name, n_synth=synthetic, m=rollouts, seed=seed, rule=rule, budget=budget, echo=echo
        )
        return self.status()

    def status(self) -> dict[str, Any]:
        """What ``stepq status --json`` prints: per set progress (``done_percent``), rates,
        ETAs and troubles, work states, live workers, the dispatcher."""
        from stepq.status import collect

        return collect(self.db)

    # --- snapshots and training -----------------------------------------------------------

    def create_snapshot(
        self,
        sets: str | Sequence[str],
        *,
        rule: str,
        val_fraction: float = 0.1,
        seed: int = 0,
        balance: bool = True,
        name: str | None = None,
        until_first_error: bool = False,
        balance_by_position: bool = False,
    ) -> int:
        """A frozen, balanced training snapshot of the sets' labels; returns its number."""
        from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot, parse_sets

        spec = SnapshotSpec(
            parse_sets(sets),
            rule,
            val_fraction,
            seed,
            balance,
            name,
            until_first_error=until_first_error,
            balance_by_position=balance_by_position,
        )
        return create_snapshot(self.db, spec)

    def export_snapshot(self, snapshot: int | str, out: str | Path, *, format: str = "parquet") -> dict[str, int]:
        """Write a snapshot as a ``datasets``-loadable folder; returns the rows per split."""
        from stepq.trainer.snapshots.export import export_snapshot

        return dict(export_snapshot(self.db, str(snapshot), Path(out), format))

    def train(
        self,
        *,
        method: str | None = None,
        recipe: str | None = None,
        recipe_options: Iterable[str] = (),
        model: str | None = None,
        snapshot: int | str | None = None,
        until_first_error: bool = False,
        set_name: str | None = None,
        search: str | None = None,
        data_dir: str | Path | None = None,
        margin: float = 0.3,
        pass_rate: str | None = None,
        keep_unparseable: bool = False,
        prefix_rollouts: bool = False,
        output: str | Path | None = None,
        wait_s: float = 0.0,
        lineage: str | None = None,
    ) -> Any:
        """Train (or resume, or report as done) a run, as ``stepq train`` does: ``method`` grpo
        or prm (the step-label PRM) on a snapshot, dpo or prm on a set, a search or an exported
        folder; ``recipe_options``
        as ``KEY=VALUE`` (``trainer.max_steps=10``); for prm on a set, ``pass_rate``
        ``"LOW:HIGH"`` (default the paper's 0.2:0.8) or ``"off"``.  Returns the ``TrainResult``."""
        from stepq.trainer import methods
        from stepq.trainer.outcomes.export import OutcomeFilter
        from stepq.trainer.training.runs import TrainOptions

        loaded = methods.recipe_for(method, recipe, tuple(recipe_options), model)
        data = methods.TrainingData(
            snapshot=None if snapshot is None else str(snapshot),
            until_first_error=until_first_error,
            set_name=set_name,
            search=search,
            data_dir=None if data_dir is None else Path(data_dir),
            margin=margin,
            outcomes=OutcomeFilter(keep_unparseable, OutcomeFilter.parse_pass_rate(pass_rate), prefix_rollouts),
        )
        options = TrainOptions(lease_ttl_s=self.settings.trainer_lease_ttl_s, wait_s=wait_s, lineage=lineage)
        return methods.train(
            self.db, method or loaded.method, loaded, data, None if output is None else Path(output), options
        )

    # --- evaluation -----------------------------------------------------------------------

    def evaluate_processbench(self, files: Sequence[str | Path], judge: Any = None, **options: Any) -> dict[str, Any]:
        """``evaluate_processbench`` (it needs no database); here for a script's convenience."""
        return evaluate_processbench(files, judge, **options)

    def evaluate_best_of_n(
        self,
        set_name: str,
        ns: Sequence[int],
        judge: Any = None,
        *,
        aggregate: str | None = None,
        choose: str = "best",
        **judge_fields: Any,
    ) -> dict[str, Any]:
        """Best-of-N over the set's trajectories (the first N of each problem) by the judge's
        aggregated step scores, beside random choice and majority vote.  ``judge``: a
        ``JudgeSpec``, or its fields as keywords (``kind="prm", model=DIR``); ``aggregate``
        None: a stepq PRM's own training aggregate, else ``min``; ``choose``: ``best`` (the
        highest-scoring sample) or ``weighted-vote`` (the answer whose scores sum highest)."""
        from stepq.trainer.evaluation.best_of_n import trained_aggregate
        from stepq.trainer.evaluation.judges import judge_stats
        from stepq.trainer.evaluation.validation import set_best_of_n

        built = _built(judge, judge_fields)
        try:
            how, why = (aggregate, "--aggregate") if aggregate is not None else trained_aggregate(built.judge)
            rows = set_best_of_n(self.db, set_name, built.judge, sorted(set(ns)), how, choose)
            return {
                **built.describe(),
                "aggregate": how,
                "choose": choose,
                "aggregate_from": why,
                **judge_stats(built.judge).as_dict(),
                "outside_training_range": built.range_note(self.db, set_name),
                "rows": [r.__dict__ for r in rows],
            }
        finally:
            built.close()


def tiny_model(
    out: str | Path, *, arch: str = "llama", layers: int = 2, width: int = 128, positions: int = 2048, seed: int = 0
) -> Path:
    """A tiny causal LM with random weights and a character tokenizer, offline (``stepq
    tiny-model``): a backbone to train a first judge on CPU in minutes."""
    from stepq.models.errors import ConfigError
    from stepq.trainer.tiny_model import build_tiny_llama, build_tiny_model

    folder = Path(out)
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError(f"{folder} is not empty: pick a new folder")
    if arch == "llama":
        if width % 64:
            raise ConfigError("the width must be a multiple of 64 for llama (its head dimension)")
        build_tiny_llama(folder, seed=seed, max_positions=positions, hidden_size=width, num_layers=layers)
    elif arch == "gpt2":
        build_tiny_model(folder, seed=seed, n_positions=positions, n_embd=width, n_layer=layers, n_head=2)
    else:
        raise ConfigError(f"unknown architecture '{arch}' (llama or gpt2)")
    return folder


def evaluate_processbench(
    files: Sequence[str | Path],
    judge: Any = None,
    *,
    predictions: Mapping[str, Any] | None = None,
    tune_file: str | Path | None = None,
    subset_tune_files: Mapping[str, str | Path] | None = None,
    oracle_threshold: bool = False,
    on_subset: Callable[[str, int], Callable[[int], None] | None] | None = None,
    limit: int | None = None,
    **judge_fields: Any,
) -> dict[str, Any]:
    """A judge (or given ``predictions``) on ProcessBench files: the official metric per
    subset, what a generative judge wrote, and a scoring judge's threshold and where it was
    chosen.  ``judge``: a ``JudgeSpec``, or its fields as keywords (``kind="prm", model=DIR``;
    ``kind="scores", scores_file=FILE``; ``threshold=0.5``).  The report's ``predictions``
    hold each sample's predicted first wrong step; ``limit``: the first so many samples of each
    file only (a quick look)."""
    from stepq.trainer.evaluation import processbench as pb

    spec = None if predictions is not None else _spec(judge, judge_fields)
    built = None if spec is None else _built(spec, {})
    try:
        report = pb.evaluate(
            [Path(f) for f in files],
            None if built is None else built.judge,
            scoring=built is not None and built.scoring,
            predictions=predictions,
            threshold=spec.threshold if spec is not None else 0.5,
            tune_file=None if tune_file is None else Path(tune_file),
            subset_tune_files={k: Path(v) for k, v in (subset_tune_files or {}).items()},
            oracle_threshold=oracle_threshold,
            on_subset=on_subset,
            limit=limit,
        )
    finally:
        if built is not None:
            built.close()
    return {**(built.describe() if built is not None else {"judge": "predictions"}), **report}


def _spec(judge: Any, fields: Mapping[str, Any]) -> Any:
    from stepq.trainer.evaluation.judge_spec import JudgeSpec

    return judge if judge is not None else JudgeSpec(**fields)


def _built(judge: Any, fields: Mapping[str, Any]) -> Any:
    from stepq.trainer.evaluation.judge_spec import build_judge

    return build_judge(_spec(judge, fields))
