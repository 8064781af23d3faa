"""CLI commands of the trainer half: snapshots, the other signals' exports, training (GRPO,
step-wise DPO, the discriminative PRM) and the trainer service.

Thin wrappers over ``stepq.trainer``; importing the module registers them on ``stepq``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from stepq.commands.base import backend_from_options, client, friendly, load_settings, main, open_db, setup_logging
from stepq.models.errors import ConfigError
from stepq.trainer import methods
from stepq.workers.backends import BACKENDS as BACKEND_NAMES

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
@click.option(
    "--until-first-error",
    is_flag=True,
    help="Keep a trajectory's chunks only while the prefix before them is alive (q_before > 0): each solution "
    "up to its first error, as OmegaPRM and PRM800K label (default: every labelled chunk, StepWiser's).",
)
@click.option(
    "--balance-by-position",
    is_flag=True,
    help="Balance each step position on its own, so a step's place in its solution says nothing about its label "
    "(default: 50/50 over each split, StepWiser's).",
)
@friendly
def snapshot_create(
    sets: str,
    rule: str,
    val_fraction: float,
    seed: int,
    balance: bool,
    name: str | None,
    until_first_error: bool,
    balance_by_position: bool,
) -> None:
    """Freeze the currently labelled chunks into a numbered snapshot."""
    from stepq.models import queries
    from stepq.trainer.snapshots.create import validation_note

    api = client()
    number = api.create_snapshot(
        sets,
        rule=rule,
        val_fraction=val_fraction,
        seed=seed,
        balance=balance,
        name=name,
        until_first_error=until_first_error,
        balance_by_position=balance_by_position,
    )
    with api.db.session() as session:
        snap = queries.get_snapshot(session, number)
        counts = snap.manifest["counts"]
    click.echo(
        f"snapshot {number} '{snap.name}': train {counts['train']['positive']}+/{counts['train']['negative']}-, "
        f"validation {counts['validation']['positive']}+/{counts['validation']['negative']}- "
        f"(hash {snap.content_hash[:12]})"
    )
    if note := validation_note(counts):
        click.echo(f"note: {note}")


@main.group("export")
def export_group() -> None:
    """Other training signals from the same rows: step preference pairs (step-wise DPO) and
    outcome-labelled solutions (discriminative PRMs)."""


@export_group.command("preferences")
@click.option("--set", "set_name", default=None, help="Pairs derived from this set's Q-values.")
@click.option("--search", default=None, help="Or: the pairs this step search's pairwise judge chose.")
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
def export_preferences_command(set_name: str | None, search: str | None, out: Path, margin: float, fmt: str) -> None:
    """Step preference pairs (prompt, chosen, rejected) for DPOTrainer: derived from stored
    Q-values (sibling next steps of a shared prefix whose Q differ by at least --margin), or
    chosen by a step search's pairwise judge (--search)."""
    from stepq.trainer.preferences.export import export_preferences

    n = export_preferences(open_db(load_settings()), set_name, out, margin=margin, fmt=fmt, search=search)
    source = f"search '{search}'" if search else f"set '{set_name}'"
    click.echo(f"{source}: {n} step preference pairs written to {out} (load with datasets.load_dataset)")


@export_group.command("outcomes")
@click.option("--set", "set_name", required=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output folder (datasets-loadable).")
@click.option(
    "--pass-rate",
    default=None,
    metavar="LOW:HIGH|off",
    help="Keep only questions whose responses (trajectories, rollouts from the problem alone) are right at a rate "
    "in [LOW, HIGH]; off keeps every question.  Default: the paper's 0.2:0.8.",
)
@click.option(
    "--keep-unparseable",
    is_flag=True,
    help="Keep solutions with no parseable answer, as wrong (default: dropped, as the paper does).",
)
@click.option(
    "--prefix-rollouts",
    is_flag=True,
    help="Also rollouts from every later prefix, as extra solutions (stepq's option; default: the paper's "
    "responses to the question only).",
)
@friendly
def export_outcomes_command(
    set_name: str, out: Path, pass_rate: str | None, keep_unparseable: bool, prefix_rollouts: bool
) -> None:
    """Graded solutions with a parseable answer, step by step, with their outcomes, for
    outcome-supervised (discriminative) PRMs: by default the paper's data (the policy's
    responses to each question, of questions it solves 20-80% of the time)."""
    from stepq.trainer.outcomes.export import OutcomeFilter, export_outcomes

    keep = OutcomeFilter(keep_unparseable, OutcomeFilter.parse_pass_rate(pass_rate), prefix_rollouts)
    counts = export_outcomes(open_db(load_settings()), set_name, out, keep)
    click.echo(
        f"set '{set_name}': {counts['trajectory']} trajectories and {counts['rollout']} rollouts with their "
        f"outcomes written to {out}"
    )


@export_group.command("stepwise")
@click.option("--snapshot", "ref", required=True, help="Snapshot number or name.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output folder (datasets-loadable).")
@click.option(
    "--until-first-error",
    is_flag=True,
    help="Each trajectory's steps only while the prefix before them is alive (q_before > 0): up to its first error.",
)
@friendly
def export_stepwise_command(ref: str, out: Path, until_first_error: bool) -> None:
    """A snapshot in the stepwise-supervision layout (prompt, completions, labels) that PRM
    trainers read; every label is the snapshot's own."""
    from stepq.trainer.snapshots.stepwise import export_stepwise

    counts = export_stepwise(open_db(load_settings()), ref, out, until_first_error=until_first_error)
    click.echo(f"snapshot {ref}: " + ", ".join(f"{k} {v} records" for k, v in counts.items()) + f" written to {out}")


@export_group.command("rationales")
@click.option("--snapshot", "ref", required=True, help="Snapshot number or name: its training chunks are asked.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output folder (train.jsonl, manifest).")
@click.option("--teacher-backend", type=click.Choice(BACKEND_NAMES), required=True, help="The teacher's backend.")
@click.option("--teacher-model", default=None, help="The teacher model (a folder, hub id or served name).")
@click.option("--teacher-base-url", default=None, help="openai backend: the server's URL.")
@click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE", help="More teacher config.")
@click.option(
    "--samples",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Answers asked per chunk; the first whose verdict agrees with the label is kept.",
)
@click.option("--temperature", type=click.FloatRange(min=0), default=1.0, show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=1), default=2048, show_default=True)
@click.option("--judge-template", type=click.Path(exists=True, path_type=Path), default=None)
@click.option("--chat-template/--no-chat-template", default=True, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@friendly
def export_rationales_command(
    ref: str,
    out: Path,
    teacher_backend: str,
    teacher_model: str | None,
    teacher_base_url: str | None,
    backend_options: tuple[str, ...],
    samples: int,
    temperature: float,
    max_tokens: int,
    judge_template: Path | None,
    chat_template: bool,
    seed: int,
) -> None:
    """A teacher's rationales for a snapshot's training chunks, each kept only where its
    verdict agrees with the chunk's Monte Carlo label (rejection sampling), for 'stepq train
    --method sft --data OUT'."""
    from stepq.trainer.generative_judge.prompt import JudgePrompt
    from stepq.trainer.snapshots.rationales import teacher_rationales, write_rationales
    from stepq.workers.backends import SamplingParams

    template = JudgePrompt.load(judge_template) if judge_template else JudgePrompt.load()
    teacher = backend_from_options(teacher_backend, teacher_model, teacher_base_url, backend_options)
    try:
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
        records, report = teacher_rationales(
            open_db(load_settings()),
            ref,
            teacher,
            params,
            template=template,
            chat_template=chat_template,
            samples=samples,
            seed=seed,
        )
    finally:
        teacher.close()
    write_rationales(out, records, report, template, snapshot=ref, teacher=teacher.generator, samples=samples)
    per_label = ", ".join(f"{label} {report.kept[label]}/{report.asked[label]}" for label in sorted(report.asked))
    click.echo(
        f"snapshot {ref}: {len(records)} rationales kept of {sum(report.asked.values())} chunks ({per_label}); "
        f"{report.no_verdict} of {report.answers} answers had no verdict; written to {out}"
    )
    if not records:
        raise ConfigError("no answer of the teacher agreed with its chunk's label: nothing to train on")


@snapshot.command("list")
@click.option("--json", "as_json", is_flag=True)
@friendly
def snapshot_list(as_json: bool) -> None:
    """Snapshots with their class counts per split (the snapshot_summary view)."""
    from stepq.models import queries

    with open_db(load_settings()).session() as session:
        rows = queries.snapshot_summaries(session)
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
    from stepq.models import queries

    with open_db(load_settings()).session() as session:
        snap = queries.get_snapshot(session, ref)
        click.echo(json.dumps({"snapshot": snap.id, "name": snap.name, **snap.manifest}, indent=2, sort_keys=True))


@snapshot.command("delete")
@click.argument("ref")
@click.option("--yes", is_flag=True, help="Confirm: the snapshot's rows go (its sets and labels stay).")
@click.option(
    "--trained",
    is_flag=True,
    help="Delete it even though runs trained on it: they keep their rows and models and name it as deleted.",
)
@friendly
def snapshot_delete(ref: str, yes: bool, trained: bool) -> None:
    """Delete a snapshot (refused while a training run names it, unless --trained)."""
    from stepq.models import queries

    database = open_db(load_settings())
    if not yes:
        with database.session() as session:
            snap = queries.get_snapshot(session, ref)  # a missing snapshot says so first
        raise ConfigError(f"deleting snapshot {snap.id} ({snap.name}) removes its rows: pass --yes to confirm")
    with database.session() as session:
        gone = queries.delete_snapshot(session, ref, trained=trained)
    runs = f"; training run(s) {', '.join(map(str, gone['runs']))} keep their rows" if gone["runs"] else ""
    click.echo(f"snapshot {gone['snapshot']} ({gone['name']}) deleted: {gone['rows']} rows{runs}")


@snapshot.command("export")
@click.argument("ref")
@click.option("--format", "fmt", type=click.Choice(["parquet", "jsonl"]), default="parquet", show_default=True)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True)
@friendly
def snapshot_export(ref: str, fmt: str, out_dir: Path) -> None:
    """Write the snapshot as a datasets-loadable folder (train/validation + manifest)."""
    counts = client().export_snapshot(ref, out_dir, format=fmt)
    click.echo(f"wrote {out_dir}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


# --- training -----------------------------------------------------------------------


@main.group(invoke_without_command=True)
@click.option(
    "--method",
    type=click.Choice(methods.names()),
    default=None,
    help="; ".join(f"{m.name}: {m.summary}" for m in methods.REGISTRY.values()) + ".  Default: the recipe's.",
)
@click.option(
    "--snapshot",
    "snapshot_ref",
    default=None,
    help="grpo: the judge's snapshot; prm: train the step-label PRM on its step labels (number or name).",
)
@click.option(
    "--until-first-error",
    is_flag=True,
    help="prm --snapshot: each trajectory's labelled steps up to its first dead prefix (as the stepwise export).",
)
@click.option("--set", "set_name", default=None, help="dpo/prm: derive the training data from this problem set.")
@click.option("--search", "search_name", default=None, help="dpo: the step pairs this step search chose.")
@click.option(
    "--data",
    "data_dir",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="dpo/prm: a folder written by 'stepq export preferences|outcomes'.",
)
@click.option("--margin", type=click.FloatRange(0, 1, min_open=True), default=0.3, show_default=True, help="dpo --set.")
@click.option(
    "--pass-rate",
    default=None,
    metavar="LOW:HIGH|off",
    help="prm --set: keep only questions whose responses are right at a rate in [LOW, HIGH]; off keeps every "
    "question.  Default: the paper's 0.2:0.8.",
)
@click.option(
    "--keep-unparseable",
    is_flag=True,
    help="prm --set: keep solutions with no parseable answer, as wrong (default: dropped, as the paper does).",
)
@click.option(
    "--prefix-rollouts",
    is_flag=True,
    help="prm --set: also rollouts from every later prefix, as extra solutions (stepq's option).",
)
@click.option("--recipe", default=None, help="Recipe YAML (path or shipped name); default: the method's shipped one.")
@click.option("--model", default=None, help="The base model (a folder or hub id), instead of the recipe's.")
@click.option(
    "--recipe-option",
    "recipe_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a recipe key: trainer.FIELD=VALUE for the method's config (e.g. trainer.bf16=false), or a "
    "top-level key (judge_template=FILE).  Repeatable; values are YAML.",
)
@click.option("--output", type=click.Path(path_type=Path), default=None, help="Default: runs/<method>-<data>.")
@click.option("--lineage", default=None, help="Record the run under this lineage (the trainer service sets it).")
@click.option("--wait", type=float, default=0.0, help="Seconds to wait for another trainer's lease on this run.")
@click.pass_context
@friendly
def train(
    ctx: click.Context,
    method: str | None,
    snapshot_ref: str | None,
    until_first_error: bool,
    set_name: str | None,
    search_name: str | None,
    data_dir: Path | None,
    margin: float,
    pass_rate: str | None,
    keep_unparseable: bool,
    prefix_rollouts: bool,
    recipe: str | None,
    model: str | None,
    recipe_options: tuple[str, ...],
    output: Path | None,
    lineage: str | None,
    wait: float,
) -> None:
    """Train on the database's rows: started again with the same --output, it resumes its
    last checkpoint; a finished run is reported, not redone.

    Runs under 'torchrun' and 'accelerate launch' as well (DDP, DeepSpeed): every rank
    trains, rank 0 alone records the run."""
    if ctx.invoked_subcommand is not None:
        return
    from stepq.trainer.training.ranks import current_rank, die_with_launcher

    die_with_launcher()
    settings = load_settings()
    setup_logging(settings.log_level, settings.log_format)  # progress, resumes: the trainers' log lines
    result = client().train(
        method=method,
        recipe=recipe,
        recipe_options=recipe_options,
        model=model,
        snapshot=snapshot_ref,
        until_first_error=until_first_error,
        set_name=set_name,
        search=search_name,
        data_dir=data_dir,
        margin=margin,
        pass_rate=pass_rate,
        keep_unparseable=keep_unparseable,
        prefix_rollouts=prefix_rollouts,
        output=output,
        wait_s=wait,
        lineage=lineage,
    )
    if not current_rank().is_main:
        return
    how = f"resumed from {result.resumed_from}" if result.resumed_from else "from the start"
    click.echo(
        f"training run {result.run_id} {result.status} at step {result.global_step} ({how}): {result.final_model}"
    )


@train.command("plan")
@click.option("--recipe", default=methods.REGISTRY["grpo"].recipe, show_default=True)
@click.option("--recipe-option", "recipe_options", multiple=True, metavar="KEY=VALUE", help="As for 'stepq train'.")
@click.option("--gpus", type=click.IntRange(min=1), required=True, help="GPUs of the node.")
@click.option(
    "--server-gpus",
    type=click.IntRange(min=0),
    default=0,
    help="vLLM server mode: GPUs for 'trl vllm-serve' (default: the recipe's vllm_tensor_parallel_size).",
)
@click.option("--snapshot", "snapshot_ref", default="1", show_default=True)
@click.option("--output", default=None, help="The run's output folder (default: runs/snapshot-N).")
@friendly
def train_plan(
    recipe: str, recipe_options: tuple[str, ...], gpus: int, server_gpus: int, snapshot_ref: str, output: str | None
) -> None:
    """Print the commands that train a recipe on one node of GPUS: the torchrun launch and,
    for a recipe in TRL's vLLM server mode, the generation server on its own GPUs."""
    from stepq.trainer.training.launch import launch_plan
    from stepq.trainer.training.recipe import Recipe

    args = ["--snapshot", snapshot_ref, "--recipe", recipe, "--output", output or f"runs/snapshot-{snapshot_ref}"]
    args += [a for option in recipe_options for a in ("--recipe-option", option)]
    plan = launch_plan(Recipe.load(recipe).with_options(recipe_options), gpus, args, server_gpus)
    for line in plan.shell():
        click.echo(line)


@train.command("list")
@click.option("--json", "as_json", is_flag=True)
@friendly
def train_list(as_json: bool) -> None:
    """Training runs with their latest metrics (the training_progress view)."""
    from stepq.models import queries

    with open_db(load_settings()).session() as session:
        rows = queries.training_progress(session)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    click.echo(
        f"{'run':>4}  {'method':<6} {'trained on':<30} {'status':<8} {'step':>10} {'loss':>7} {'reward':>7} "
        f"{'acc+':>6} {'acc-':>6}  lineage"
    )

    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}"

    for r in rows:
        steps = f"{r['step']}/{r['max_steps'] or '?'}"
        click.echo(
            f"{r['run']:>4}  {r['method']:<6} {(r['snapshot'] or r['dataset'] or '-')[-30:]:<30} {r['status']:<8} "
            f"{steps:>10} {f(r['loss']):>7} {f(r['reward']):>7} "
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
@click.option(
    "--until-first-error", is_flag=True, help="Snapshots keep each solution's chunks up to its first error only."
)
@click.option("--balance-by-position", is_flag=True, help="Snapshots balance each step position on its own.")
@click.option("--poll", "poll_s", type=click.FloatRange(min=0.1), default=30.0, show_default=True)
@click.option("--max-trainings", type=click.IntRange(min=1), default=None, help="Exit after this many trainings.")
@click.option("--max-idle", "max_idle_s", type=float, default=None, help="Exit after this long with nothing to do.")
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Training processes (GPUs) per run; above 1 each training is a torchrun launch of 'stepq train'.",
)
@friendly
def trainer_serve(
    lineage: str,
    sets: str | None,
    rule: str,
    min_new_chunks: int,
    recipe: str,
    output_root: Path,
    val_fraction: float,
    until_first_error: bool,
    balance_by_position: bool,
    poll_s: float,
    max_trainings: int | None,
    max_idle_s: float | None,
    processes: int,
) -> None:
    """Wait for labelled chunks, snapshot them and train, continuing the lineage."""
    from stepq.models import queries
    from stepq.trainer.service import ServiceOptions, serve
    from stepq.trainer.snapshots.create import parse_sets

    settings = load_settings()
    setup_logging(settings.log_level, settings.log_format)  # STEPQ_LOG_FORMAT=json applies here too
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
        until_first_error=until_first_error,
        balance_by_position=balance_by_position,
        poll_s=poll_s,
        lease_ttl_s=settings.trainer_lease_ttl_s,
        max_trainings=max_trainings,
        max_idle_s=max_idle_s,
        processes=processes,
    )
    n = serve(db, options, say=lambda m: click.echo(f"stepq trainer: {m}", err=True))
    click.echo(f"trainer served lineage '{lineage}': {n} training(s)")


@main.command("tiny-model")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Folder to write the model to.")
@click.option(
    "--arch",
    type=click.Choice(["llama", "gpt2"]),
    default="llama",
    show_default=True,
    help="llama: head dimension 64 (vLLM's CPU kernels run it) and a chat template.",
)
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--width",
    type=click.IntRange(min=64),
    default=128,
    show_default=True,
    help="Hidden size (llama: a multiple of 64).",
)
@click.option("--positions", type=click.IntRange(min=64), default=2048, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@friendly
def tiny_model(out: Path, arch: str, layers: int, width: int, positions: int, seed: int) -> None:
    """Build a tiny causal LM with random weights and a character tokenizer, offline: a model
    to train a first judge on CPU in minutes (it learns only what its training teaches it)."""
    from stepq.api import tiny_model as build

    build(out, arch=arch, layers=layers, width=width, positions=positions, seed=seed)
    click.echo(f"tiny {arch} ({layers} layers, width {width}, random weights) written to {out}")
