"""CLI commands of the trainer half: snapshots, training, the trainer service, evaluation.

Thin wrappers over ``stepq.trainer``; importing the module registers them on ``stepq``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from stepq.commands.base import backend_config, friendly, load_settings, main, open_db
from stepq.models.errors import ConfigError
from stepq.workers.backends import BACKENDS as BACKEND_NAMES

JUDGES = ("model", "oracle", "label-oracle", "accept-all", "scores")


@contextmanager
def progress(total: int, what: str) -> Iterator[Callable[[int], None]]:
    """A progress bar with ETA on a terminal (plain when not a terminal)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda n: bar.advance(task, n)


# --- snapshots ----------------------------------------------------------------------


@main.group()
def snapshot() -> None:
    """Immutable, balanced snapshots of labelled chunks for judge training."""


@snapshot.command("create")
@click.option("--sets", required=True, help="Problem sets, comma-separated.")
@click.option("--rule", required=True, help="Label rule, e.g. abs-q or rel-effective:alpha=0.4.")
@click.option("--val-fraction", type=click.FloatRange(0, 1, max_open=True), default=0.1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--balance/--no-balance", default=True, show_default=True, help="Down-sample to exactly 50/50.")
@click.option("--name", default=None, help="Default: snapshot-N.")
@friendly
def snapshot_create(sets: str, rule: str, val_fraction: float, seed: int, balance: bool, name: str | None) -> None:
    """Freeze the currently labelled chunks into a numbered snapshot."""
    from stepq.models import training_queries as tq
    from stepq.trainer.snapshots.create import SnapshotSpec, create_snapshot, parse_sets

    db = open_db(load_settings())
    number = create_snapshot(db, SnapshotSpec(parse_sets(sets), rule, val_fraction, seed, balance, name))
    with db.session() as session:
        snap = tq.get_snapshot(session, number)
        counts = snap.manifest["counts"]
    click.echo(
        f"snapshot {number} '{snap.name}': train {counts['train']['positive']}+/{counts['train']['negative']}-, "
        f"validation {counts['validation']['positive']}+/{counts['validation']['negative']}- "
        f"(hash {snap.content_hash[:12]})"
    )


@main.group("export")
def export_group() -> None:
    """Other training signals from the same rows: step preference pairs (step-wise DPO) and
    outcome-labelled solutions (discriminative PRMs)."""


@export_group.command("preferences")
@click.option("--set", "set_name", required=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output folder (datasets-loadable).")
@click.option(
    "--margin",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.3,
    show_default=True,
    help="Least Q gap between the chosen and the rejected next step.",
)
@click.option("--format", "fmt", type=click.Choice(["jsonl", "parquet"]), default="jsonl", show_default=True)
@friendly
def export_preferences_command(set_name: str, out: Path, margin: float, fmt: str) -> None:
    """Step preference pairs derived from stored Q-values: sibling next steps of a shared
    prefix whose Q differ by at least --margin (prompt, chosen, rejected) for DPOTrainer."""
    from stepq.trainer.preferences.export import export_preferences

    n = export_preferences(open_db(load_settings()), set_name, out, margin=margin, fmt=fmt)
    click.echo(f"set '{set_name}': {n} step preference pairs written to {out} (load with datasets.load_dataset)")


@export_group.command("outcomes")
@click.option("--set", "set_name", required=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output folder (datasets-loadable).")
@friendly
def export_outcomes_command(set_name: str, out: Path) -> None:
    """Every graded solution, step by step, with its outcome: the set's trajectories and its
    rollouts (prefix chunks + continuation), for outcome-supervised (discriminative) PRMs."""
    from stepq.trainer.outcomes.export import export_outcomes

    counts = export_outcomes(open_db(load_settings()), set_name, out)
    click.echo(
        f"set '{set_name}': {counts['trajectory']} trajectories and {counts['rollout']} rollouts with their "
        f"outcomes written to {out}"
    )


@snapshot.command("list")
@click.option("--json", "as_json", is_flag=True)
@friendly
def snapshot_list(as_json: bool) -> None:
    """Snapshots with their class counts per split (the snapshot_summary view)."""
    from stepq.models import training_queries as tq

    with open_db(load_settings()).session() as session:
        rows = tq.snapshot_summaries(session)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    click.echo(f"{'#':>4}  {'name':<24} {'rule':<24} {'train +/-':>13} {'val +/-':>11}  created")
    for r in rows:
        click.echo(
            f"{r['snapshot']:>4}  {r['name']:<24} {r['label_rule']:<24} "
            f"{r['train_positive']:>6}/{r['train_negative']:<6} "
            f"{r['validation_positive']:>5}/{r['validation_negative']:<5}  {r['created_at']}"
        )


@snapshot.command("show")
@click.argument("ref")
@friendly
def snapshot_show(ref: str) -> None:
    """A snapshot's manifest."""
    from stepq.models import training_queries as tq

    with open_db(load_settings()).session() as session:
        snap = tq.get_snapshot(session, ref)
        click.echo(json.dumps({"snapshot": snap.id, "name": snap.name, **snap.manifest}, indent=2, sort_keys=True))


@snapshot.command("export")
@click.argument("ref")
@click.option("--format", "fmt", type=click.Choice(["parquet", "jsonl"]), default="parquet", show_default=True)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True)
@friendly
def snapshot_export(ref: str, fmt: str, out_dir: Path) -> None:
    """Write the snapshot as a datasets-loadable folder (train/validation + manifest)."""
    from stepq.trainer.snapshots.export import export_snapshot

    counts = export_snapshot(open_db(load_settings()), ref, out_dir, fmt)
    click.echo(f"wrote {out_dir}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


# --- training -----------------------------------------------------------------------


@main.group(invoke_without_command=True)
@click.option("--snapshot", "snapshot_ref", default=None, help="Snapshot number or name.")
@click.option("--recipe", default="stepwiser-judge.yaml", show_default=True, help="Recipe YAML (path or shipped name).")
@click.option("--output", type=click.Path(path_type=Path), default=None, help="Default: runs/snapshot-N.")
@click.option("--wait", type=float, default=0.0, help="Seconds to wait for another trainer's lease on this run.")
@click.pass_context
@friendly
def train(ctx: click.Context, snapshot_ref: str | None, recipe: str, output: Path | None, wait: float) -> None:
    """Train a judge on a snapshot with GRPO; started again, it resumes its last checkpoint."""
    if ctx.invoked_subcommand is not None:
        return
    if snapshot_ref is None:
        raise click.UsageError("--snapshot is required (or a subcommand: list)")
    from stepq.trainer.training.grpo import TrainOptions, train_judge
    from stepq.trainer.training.recipe import Recipe

    settings = load_settings()
    db = open_db(settings)
    out = output or Path("runs") / f"snapshot-{snapshot_ref}"
    result = train_judge(
        db, snapshot_ref, Recipe.load(recipe), out, TrainOptions(lease_ttl_s=settings.trainer_lease_ttl_s, wait_s=wait)
    )
    how = f"resumed from {result.resumed_from}" if result.resumed_from else "from the start"
    click.echo(
        f"training run {result.run_id} {result.status} at step {result.global_step} ({how}): {result.final_model}"
    )


@train.command("list")
@click.option("--json", "as_json", is_flag=True)
@friendly
def train_list(as_json: bool) -> None:
    """Training runs with their latest metrics (the training_progress view)."""
    from stepq.models import training_queries as tq

    with open_db(load_settings()).session() as session:
        rows = tq.training_progress(session)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    click.echo(
        f"{'run':>4}  {'snapshot':<20} {'status':<8} {'step':>10} {'reward':>7} {'acc+':>6} {'acc-':>6}  lineage"
    )

    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}"

    for r in rows:
        steps = f"{r['step']}/{r['max_steps'] or '?'}"
        click.echo(
            f"{r['run']:>4}  {r['snapshot']:<20} {r['status']:<8} {steps:>10} {f(r['reward']):>7} "
            f"{f(r['accuracy_positive']):>6} {f(r['accuracy_negative']):>6}  {r['lineage'] or '-'}"
        )


@main.group()
def trainer() -> None:
    """The long-running trainer service."""


@trainer.command("serve")
@click.option("--lineage", default="judge", show_default=True, help="One trainer per lineage at a time.")
@click.option("--sets", default=None, help="Problem sets, comma-separated (default: every set).")
@click.option("--rule", default="abs-q", show_default=True)
@click.option("--min-new-chunks", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--recipe", default="stepwiser-judge.yaml", show_default=True)
@click.option("--output-root", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
@click.option("--val-fraction", type=click.FloatRange(0, 1, max_open=True), default=0.1, show_default=True)
@click.option("--poll", "poll_s", type=click.FloatRange(min=0.1), default=30.0, show_default=True)
@click.option("--max-trainings", type=click.IntRange(min=1), default=None, help="Exit after this many trainings.")
@click.option("--max-idle", "max_idle_s", type=float, default=None, help="Exit after this long with nothing to do.")
@friendly
def trainer_serve(
    lineage: str,
    sets: str | None,
    rule: str,
    min_new_chunks: int,
    recipe: str,
    output_root: Path,
    val_fraction: float,
    poll_s: float,
    max_trainings: int | None,
    max_idle_s: float | None,
) -> None:
    """Wait for labelled chunks, snapshot them and train, continuing the lineage."""
    import logging

    from stepq.models import queries
    from stepq.trainer.snapshots.create import parse_sets
    from stepq.trainer.training.service import ServiceOptions, serve

    settings = load_settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    db = open_db(settings)
    if sets:
        names = parse_sets(sets)
    else:
        with db.session() as session:
            names = tuple(r["problem_set"] for r in queries.progress(session))
    if not names:
        raise ConfigError("no problem sets to train on (ingest or synth one, or pass --sets)")
    options = ServiceOptions(
        lineage=lineage,
        recipe=recipe,
        output_root=output_root.resolve(),
        sets=names,
        rule=rule,
        min_new_chunks=min_new_chunks,
        val_fraction=val_fraction,
        poll_s=poll_s,
        lease_ttl_s=settings.trainer_lease_ttl_s,
        max_trainings=max_trainings,
        max_idle_s=max_idle_s,
    )
    n = serve(db, options, say=lambda m: click.echo(f"stepq trainer: {m}", err=True))
    click.echo(f"trainer served lineage '{lineage}': {n} training(s)")


# --- evaluation ---------------------------------------------------------------------


def judge_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options that pick and configure a judge, shared by every eval command."""
    options = [
        click.option("--judge", type=click.Choice(JUDGES), default="model", show_default=True),
        click.option("--backend", type=click.Choice(BACKEND_NAMES), default="hf", show_default=True),
        click.option("--model", default=None, help="The judge model (a directory for hf/vllm)."),
        click.option("--base-url", default=None),
        click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE"),
        click.option("--votes", type=click.IntRange(min=1), default=1, show_default=True, help="Majority of K."),
        click.option("--temperature", type=float, default=None, help="Default: 0 with one vote, 1 with several."),
        click.option("--max-tokens", type=int, default=1024, show_default=True),
        click.option(
            "--scores",
            "scores_file",
            type=click.Path(path_type=Path),
            default=None,
            help="--judge scores: JSONL of {id, scores: [per step]}.",
        ),
        click.option("--threshold", type=float, default=0.5, show_default=True),
        click.option(
            "--chat-template/--raw-prompt",
            default=True,
            show_default=True,
            help="Send the judge prompt through the model's chat template (as a recipe with conversational: true).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def build_judge(kw: dict[str, Any]) -> Any:
    from stepq.trainer.evaluation import judges

    kind = kw["judge"]
    if kind == "oracle":
        return judges.SyntheticOracle()
    if kind == "label-oracle":
        return judges.LabelOracle()
    if kind == "accept-all":
        return judges.AcceptAll()
    if kind == "scores":
        if kw["scores_file"] is None:
            raise ConfigError("--judge scores needs --scores FILE")
        table = {}
        for line in kw["scores_file"].read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                table[str(row["id"])] = [float(x) for x in row["scores"]]
        return judges.ScoreJudge(lambda sid, step: table[sid][step], kw["threshold"])
    if not kw["model"] and kw["backend"] != "synthetic":
        raise ConfigError(f"--judge model with --backend {kw['backend']} needs --model")
    from stepq.workers.backends import SamplingParams, make_backend

    backend = make_backend(kw["backend"], backend_config(kw["model"], kw["base_url"], kw["backend_options"]))
    import atexit

    atexit.register(backend.close)  # an engine's processes must stop for the command to exit
    temperature = kw["temperature"] if kw["temperature"] is not None else (0.0 if kw["votes"] == 1 else 1.0)
    return judges.ModelJudge(
        backend,
        SamplingParams(temperature=temperature, max_tokens=kw["max_tokens"]),
        votes=kw["votes"],
        chat_template=kw["chat_template"],
    )


@main.group("eval")
def eval_group() -> None:
    """Evaluate judges: ProcessBench, a snapshot's validation split, Best-of-N, chunk-reset."""


@eval_group.command("processbench")
@click.option("--data", "files", type=click.Path(exists=True, path_type=Path), multiple=True, required=True)
@click.option(
    "--predictions",
    "predictions_file",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Score this JSONL of {id, prediction} instead of running a judge.",
)
@click.option(
    "--out", "out_dir", type=click.Path(path_type=Path), default=None, help="Write predictions + scores here."
)
@click.option("--json", "as_json", is_flag=True)
@judge_options
@friendly
def eval_processbench(
    files: tuple[Path, ...], predictions_file: Path | None, out_dir: Path | None, as_json: bool, **kw: Any
) -> None:
    """Predict each sample's first wrong step and score it with the official metric."""
    from stepq.trainer.evaluation import processbench as pb

    given = pb.load_predictions(predictions_file) if predictions_file else None
    judge = None if given is not None else build_judge(kw)
    scores, all_predictions = [], {}
    predictions: dict[str, Any]
    for path in files:
        samples = pb.load_samples(path)
        if given is not None:
            predictions = {s["id"]: given.get(s["id"]) for s in samples}
        else:
            assert judge is not None
            with progress(len(samples), f"{path.stem}") as advance:
                predictions = dict(pb.predict(judge, samples, advance))
        all_predictions.update(predictions)
        scores.append(pb.score(pb.subset_name(path), {s["id"]: s["label"] for s in samples}, predictions))
    report = {"judge": kw["judge"] if given is None else "predictions", "subsets": [s.as_dict() for s in scores]}
    if len(scores) > 1:
        report["average_f1"] = sum(s.f1 for s in scores) / len(scores)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        with (out_dir / "predictions.jsonl").open("w") as fh:
            for sid, pred in all_predictions.items():
                fh.write(json.dumps({"id": sid, "prediction": pred}) + "\n")
        (out_dir / "scores.json").write_text(json.dumps(report, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"{'subset':<12} {'samples':>7} {'acc_error':>9} {'acc_correct':>11} {'F1':>6}")
    for s in scores:
        click.echo(f"{s.subset:<12} {s.samples:>7} {s.acc_error:>9.1f} {s.acc_correct:>11.1f} {s.f1:>6.1f}")
    if "average_f1" in report:
        click.echo(f"{'average':<12} {'':>7} {'':>9} {'':>11} {report['average_f1']:>6.1f}")


@eval_group.command("snapshot")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True)
@judge_options
@friendly
def eval_snapshot(ref: str, as_json: bool, **kw: Any) -> None:
    """A judge's accuracy on a snapshot's validation split: per class and balanced."""
    from stepq.trainer.evaluation.validation import validation_accuracy

    db = open_db(load_settings())
    report = validation_accuracy(db, ref, build_judge(kw))
    click.echo(
        json.dumps(report, indent=2)
        if as_json
        else f"validation of snapshot {ref}: positive {report['accuracy_positive']:.1f}%, "
        f"negative {report['accuracy_negative']:.1f}%, balanced {report['balanced_accuracy']:.1f}% "
        f"({report['rows']} chunks)"
    )


@eval_group.command("best-of-n")
@click.option("--set", "set_name", required=True, help="A set with several trajectories per problem.")
@click.option("--n", "ns", default="1,2,4,8", show_default=True, help="Values of N, comma-separated.")
@click.option(
    "--aggregate", "how", type=click.Choice(["min", "mean", "product", "last"]), default="min", show_default=True
)
@click.option("--json", "as_json", is_flag=True)
@judge_options
@friendly
def eval_best_of_n(set_name: str, ns: str, how: str, as_json: bool, **kw: Any) -> None:
    """Pick one of N trajectories per problem by its aggregated step verdicts."""
    from stepq.trainer.evaluation.validation import set_best_of_n

    rows = set_best_of_n(open_db(load_settings()), set_name, build_judge(kw), [int(n) for n in ns.split(",")], how)
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in rows], indent=2))
        return
    click.echo(f"{'N':>4} {'judge':>7} {'random':>7} {'majority':>8}")
    for r in rows:
        click.echo(f"{r.n:>4} {r.judge:>7.1f} {r.random:>7.1f} {r.majority:>8.1f}")


@eval_group.command("chunk-reset")
@click.option("--set", "set_name", required=True, help="Problems to solve; the set's backend is the policy.")
@click.option("--attempts", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@judge_options
@friendly
def eval_chunk_reset(set_name: str, attempts: int, seed: int, as_json: bool, **kw: Any) -> None:
    """Chunk-reset inference with a judge, against plain sampling on the same seeds."""
    from stepq.trainer.evaluation.validation import set_chunk_reset

    report = set_chunk_reset(open_db(load_settings()), set_name, build_judge(kw), attempts, seed)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for name in ("plain", "chunk_reset"):
        r = report[name]
        click.echo(
            f"{name:<12} accuracy {r['accuracy']:6.1f}%  chunks {r['accepted_chunks']} accepted, "
            f"{r['rejected_chunks']} rejected  tokens {r['tokens']}"
        )
