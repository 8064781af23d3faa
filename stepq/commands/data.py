"""Commands that bring problems in and turn them into trajectories and chunks: ingest, synth,
generate (policy sampling), segment."""

from __future__ import annotations

from pathlib import Path

import click

from stepq.commands.base import (
    backend_from_options,
    client,
    friendly,
    load_settings,
    main,
    open_db,
)
from stepq.workers.backends import BACKENDS as BACKEND_NAMES


@main.command()
@click.argument("file")
@click.option("--set", "set_name", required=True, help="Problem set to add the records to.")
@click.option(
    "--hf",
    "from_dataset",
    is_flag=True,
    help="FILE is a Hugging Face dataset: a hub id, a save_to_disk folder, or a folder of data files "
    "(read with datasets.load_dataset); a local data file is read as a file.",
)
@click.option("--split", default=None, help="--hf: the split to ingest (default: the only one; several are listed).")
@click.option("--hf-config", default=None, help="--hf: the dataset's configuration name, if it has several.")
@click.option("--question", default=None, help="Question field (default: problem, question or prompt).")
@click.option("--answer", default="answer", show_default=True, help="Reference answer field; '-' for none.")
@click.option(
    "--answer-format",
    type=click.Choice(["auto", "plain", "gsm8k"]),
    default="auto",
    show_default=True,
    help="gsm8k: the final answer follows '####'; auto detects it.",
)
@click.option("--id", "id_field", default=None, help="Id field (default: unique_id, id or idx; else a content hash).")
@click.option("--steps", default=None, help="Field with a list of solution steps: ingest them as a trajectory.")
@click.option("--outcome", default=None, help="Boolean field: the trajectory's outcome (else graded).")
@click.option("--first-error", default=None, help="Field: 0-based index of the first wrong step, -1 if none.")
@click.option(
    "--update",
    is_flag=True,
    help="Records whose id exists with another question or answer replace it (else: an error naming the line).",
)
@friendly
def ingest(
    file: str,
    set_name: str,
    from_dataset: bool,
    split: str | None,
    hf_config: str | None,
    question: str | None,
    answer: str,
    answer_format: str,
    id_field: str | None,
    steps: str | None,
    outcome: str | None,
    first_error: str | None,
    update: bool,
) -> None:
    """Add problems (and given trajectories) from a JSONL file, a JSON array, a Parquet file
    (by its extension), or (--hf) a Hugging Face dataset."""
    report = client().ingest(
        file,
        set_name,
        hf=from_dataset,
        split=split,
        hf_config=hf_config,
        question=question,
        answer=None if answer == "-" else answer,
        answer_format=answer_format,
        id_field=id_field,
        steps=steps,
        outcome=outcome,
        first_error=first_error,
        update=update,
    )
    click.echo(
        f"{file}: {report.records} records, {report.new_problems} new problems, "
        f"{report.new_trajectories} new trajectories in set '{set_name}'"
        + (f", {report.updated_problems} problems updated (their annotation is redone)" if update else "")
    )


@main.command()
@click.option("--set", "set_name", required=True)
@click.option("--problems", type=click.IntRange(min=1), required=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--trajectories-per-problem", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--error-rate", type=click.FloatRange(0, 1), default=0.1, show_default=True)
@click.option("--recovery-rate", type=click.FloatRange(0, 1), default=0.001, show_default=True)
@click.option(
    "--latency-s",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Simulated generation time per rollout.",
)
@click.option(
    "--op-error-rate",
    "op_error_rates",
    multiple=True,
    metavar="OP=RATE",
    help="A per-operation error rate (add, subtract, multiply), e.g. multiply=0.3: steps of one solution differ "
    "in difficulty.",
)
@click.option(
    "--slip-rate",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Harmless errors: a step shows a wrong operand but keeps the right value.",
)
@click.option(
    "--error-kind",
    "error_kinds",
    multiple=True,
    metavar="KIND[=WEIGHT]",
    help="What an error is, repeatable with weights: result (the step's own arithmetic off; the default), operand "
    "(an operand copied from elsewhere), operation (add and subtract swapped) or carry (the step starts from a "
    "value other than the one written before it). Only result errors show in the step alone.",
)
@click.option(
    "--numbers",
    type=click.Choice(["default", "small"]),
    default="default",
    show_default=True,
    help="The problems' numbers: default (starts of 2-30, operands up to 40, multiplications) or small "
    "(one-digit additions and subtractions from a start of 30-60). A judge trained on one range is brittle "
    "outside it.",
)
@friendly
def synth(
    set_name: str,
    problems: int,
    seed: int,
    trajectories_per_problem: int,
    error_rate: float,
    recovery_rate: float,
    latency_s: float,
    op_error_rates: tuple[str, ...],
    slip_rate: float,
    error_kinds: tuple[str, ...],
    numbers: str,
) -> None:
    """Create a synthetic arithmetic problem set with policy trajectories of known truth."""
    report = client().synth(
        set_name,
        problems=problems,
        seed=seed,
        trajectories_per_problem=trajectories_per_problem,
        error_rate=error_rate,
        recovery_rate=recovery_rate,
        latency_s=latency_s,
        op_error_rates=_op_rates(op_error_rates),
        slip_rate=slip_rate,
        error_kinds=_error_kinds(error_kinds),
        numbers=numbers,
    )
    click.echo(f"set '{set_name}': {report.new_problems} new problems, {report.new_trajectories} new trajectories")


def _op_rates(items: tuple[str, ...]) -> dict[str, float]:
    from stepq.models.errors import ConfigError

    names = {"add": "Add", "subtract": "Subtract", "multiply": "Multiply by"}
    out: dict[str, float] = {}
    for item in items:
        op, _, rate = item.partition("=")
        if op.lower() not in names:
            raise ConfigError(f"--op-error-rate {item!r}: the operation is one of add, subtract, multiply")
        try:
            value = float(rate)
        except ValueError:
            raise ConfigError(f"--op-error-rate {item!r}: the rate must be a number in [0, 1]") from None
        if not 0 <= value <= 1:
            raise ConfigError(f"--op-error-rate {item!r}: the rate must be in [0, 1]")
        out[names[op.lower()]] = value
    return out


def _error_kinds(items: tuple[str, ...]) -> dict[str, float] | None:
    from stepq.models.errors import ConfigError
    from stepq.workers.backends.synthetic_policy import ERROR_KINDS

    out: dict[str, float] = {}
    for item in items:
        kind, _, weight = item.partition("=")
        if kind not in ERROR_KINDS:
            raise ConfigError(f"--error-kind {item!r}: the kind is one of {', '.join(ERROR_KINDS)}")
        try:
            out[kind] = float(weight) if weight else 1.0
        except ValueError:
            raise ConfigError(f"--error-kind {item!r}: the weight must be a positive number") from None
        if out[kind] <= 0:
            raise ConfigError(f"--error-kind {item!r}: the weight must be a positive number")
    return out or None


@main.command()
@click.option("--set", "set_name", required=True)
@click.option("--samples", type=click.IntRange(min=1), required=True, help="Trajectories per problem (K).")
@click.option("--template", default=None, help="chunk (StepWiser <chunk> tags), step ('Step n:') or synthetic.")
@click.option("--template-file", type=click.Path(path_type=Path), default=None, help="A template with {question}.")
@click.option(
    "--segmentation",
    type=click.Choice(["auto", "chunk-tags", "step-markers", "blank-lines", "llm"]),
    default="auto",
    show_default=True,
)
@click.option(
    "--filter-mixed",
    is_flag=True,
    help="Keep only problems whose K outcomes are neither all right nor "
    "all wrong (the paper's prompt filter); the others are excluded from annotation.",
)
@click.option("--backend", type=click.Choice(BACKEND_NAMES), default=None, help="Default: the set's backend.")
@click.option("--model", default=None)
@click.option("--base-url", default=None)
@click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE")
@click.option("--segmenter-model", default=None, help="With --segmentation llm: the segmenting model (same backend).")
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--max-tokens", type=int, default=8192, show_default=True)
@friendly
def generate(
    set_name: str,
    samples: int,
    template: str | None,
    template_file: Path | None,
    segmentation: str,
    filter_mixed: bool,
    backend: str | None,
    model: str | None,
    base_url: str | None,
    backend_options: tuple[str, ...],
    segmenter_model: str | None,
    temperature: float,
    top_p: float,
    max_tokens: int,
) -> None:
    """Sample K policy trajectories per problem (only the missing ones), then segment them."""
    from stepq.workers.backends import SamplingParams
    from stepq.workers.data.policy_sampling import generate_trajectories, set_policy
    from stepq.workers.data.prompts import load_template

    settings = load_settings()
    database = open_db(settings, migrate=settings.embedded)
    override = backend_from_options(backend, model, base_url, backend_options) if backend else None
    policy, default_template = set_policy(database, set_name, override)
    chosen = template or default_template
    name = backend or policy.name  # an LLM segmenter runs on the policy's backend unless told
    segmenter = None
    if segmentation == "llm":
        segmenter = backend_from_options(name, segmenter_model or model, base_url, backend_options)
    try:
        report = generate_trajectories(
            database,
            set_name,
            policy,
            samples=samples,
            template=load_template(None if template_file else chosen, template_file),
            params=SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens),
            segmentation=segmentation,
            segmenter=segmenter,
            filter_mixed=filter_mixed,
        )
    finally:  # an engine runs in its own processes: the command exits only once they stop
        policy.close()
        if segmenter is not None:
            segmenter.close()
    methods = ", ".join(f"{k} {v}" for k, v in sorted(report.segmentation.items())) or "none"
    click.echo(
        f"set '{set_name}': {report.new_trajectories} new trajectories for {report.problems} problems "
        f"(segmentation: {methods})"
    )
    if filter_mixed:
        click.echo(f"prompt filter: {report.excluded_problems} problems excluded (all right or all wrong)")


@main.command()
@click.option("--set", "set_name", required=True)
@click.option(
    "--method", type=click.Choice(["auto", "chunk-tags", "step-markers", "blank-lines", "llm"]), required=True
)
@click.option("--backend", type=click.Choice(BACKEND_NAMES), default=None, help="With --method llm: the segmenter.")
@click.option("--model", default=None)
@click.option("--base-url", default=None)
@click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE")
@click.option(
    "--export-old",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A set whose steps came with the data (or carry per-step truth) is refused; with this, its old chunks "
    "and their truth are written to this new file (JSON lines) first, then re-cut.",
)
@friendly
def segment(
    set_name: str,
    method: str,
    backend: str | None,
    model: str | None,
    base_url: str | None,
    backend_options: tuple[str, ...],
    export_old: Path | None,
) -> None:
    """Segment a set's not-yet-annotated trajectories again, e.g. with a model (--method llm)."""
    from stepq.models.errors import ConfigError
    from stepq.workers.data.policy_sampling import resegment_set

    if method == "llm" and backend is None:
        raise ConfigError("--method llm needs --backend (and --model) for the segmenting model")
    segmenter = backend_from_options(backend, model, base_url, backend_options) if backend else None
    try:
        report = resegment_set(open_db(load_settings()), set_name, method, segmenter=segmenter, export_old=export_old)
    finally:
        if segmenter is not None:
            segmenter.close()
    methods = ", ".join(f"{k} {v}" for k, v in sorted(report.segmentation.items())) or "none"
    click.echo(
        f"set '{set_name}': {report.resegmented} trajectories segmented ({methods}); "
        f"{report.skipped_annotated} left alone because they are planned for annotation or annotated"
    )
    if report.exported:
        click.echo(f"the old chunks and truth of {report.exported} trajectories with given steps: {export_old}")
