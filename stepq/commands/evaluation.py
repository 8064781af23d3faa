"""CLI commands that evaluate judges: ProcessBench, a snapshot's validation split, Best-of-N,
chunk-reset and test-time step search, with any judge (a generative model on any backend, a trained PRM, a scores
file, the oracles).  Importing the module registers them on ``stepq``."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from stepq.commands.base import backend_config, client, friendly, load_settings, main, open_db
from stepq.commands.search import SearchChoices, search_options
from stepq.trainer.evaluation.best_of_n import AGGREGATORS, PICKS
from stepq.workers.backends import BACKENDS as BACKEND_NAMES

if TYPE_CHECKING:
    from stepq.trainer.evaluation.judge_spec import BuiltJudge, JudgeSpec


@contextmanager
def progress_bars() -> Iterator[Callable[[str, int], Callable[[int], None]]]:
    """Progress bars with ETA on a terminal, one per subset: yields ``add(what, total)``,
    which returns the bar's ``advance(n)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=True) as bars:

        def add(what: str, total: int) -> Callable[[int], None]:
            task = bars.add_task(what, total=total)
            return lambda n: bars.advance(task, n)

        yield add


def judge_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options that pick and configure a judge, shared by every eval command; the command
    receives them as one ``spec: JudgeSpec``."""
    from stepq.trainer.evaluation.judge_spec import JUDGE_KINDS, SCORE_BY

    options = [
        click.option("--judge", type=click.Choice(JUDGE_KINDS), default="model", show_default=True),
        click.option("--backend", type=click.Choice(BACKEND_NAMES), default="hf", show_default=True),
        click.option("--model", default=None, help="The judge model (a directory for hf/vllm)."),
        click.option("--base-url", default=None),
        click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE"),
        click.option("--votes", type=click.IntRange(min=1), default=1, show_default=True, help="Majority of K."),
        click.option("--temperature", type=float, default=None, help="Default: 0 with one vote, 1 with several."),
        click.option(
            "--max-tokens",
            type=click.IntRange(min=1),
            default=None,
            help="Longest analysis.  Default: the judge's training max_completion_length (stepq-judge.json beside "
            "the model), else 3072 (the shipped recipe's).",
        ),
        click.option(
            "--judge-template",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            default=None,
            help="Judge prompt template (default: the one the judge was trained with, else the shipped one).",
        ),
        click.option(
            "--chat-template/--raw-prompt",
            default=None,
            help="Send the judge prompt through the model's chat template or raw.  Default: as the judge was "
            "trained (its recipe's conversational), else the chat template.",
        ),
        click.option(
            "--score-by",
            type=click.Choice(SCORE_BY),
            default="verdict",
            show_default=True,
            help="--judge model: accept by verdict, or score each step by P(Positive): the share of Positive over "
            "--votes K (votes), or the model's probability at the verdict (logprob, hf backend).",
        ),
        click.option(
            "--scores",
            "scores_file",
            type=click.Path(path_type=Path),
            default=None,
            help="--judge scores: JSONL of {id, scores: [per step]}.",
        ),
        click.option(
            "--threshold",
            type=float,
            default=0.5,
            show_default=True,
            help="Scoring judges (prm, scores, --score-by): accept a step at this score.",
        ),
    ]

    @functools.wraps(fn)
    def with_spec(
        *args: Any,
        judge: str,
        backend: str,
        model: str | None,
        base_url: str | None,
        backend_options: tuple[str, ...],
        votes: int,
        temperature: float | None,
        max_tokens: int | None,
        judge_template: Path | None,
        chat_template: bool | None,
        score_by: str,
        scores_file: Path | None,
        threshold: float,
        **rest: Any,
    ) -> Any:
        from stepq.trainer.evaluation.judge_spec import JudgeSpec

        spec = JudgeSpec(
            kind=judge,
            backend=backend,
            model=model,
            backend_config=backend_config(None, base_url, backend_options),
            votes=votes,
            temperature=temperature,
            max_tokens=max_tokens,
            chat_template=chat_template,
            judge_template=judge_template,
            score_by=score_by,
            scores_file=scores_file,
            threshold=threshold,
            api_key=load_settings().openai_api_key or None,
        )
        return fn(*args, spec=spec, **rest)

    for option in reversed(options):
        with_spec = option(with_spec)
    return with_spec


def build_judge(spec: JudgeSpec) -> BuiltJudge:
    """The judge ``spec`` describes; a generative judge's backend is closed when the command
    ends, whether it returns or fails (an engine's processes must stop)."""
    from stepq.trainer.evaluation.judge_spec import build_judge as build

    built = build(spec)
    click.get_current_context().call_on_close(built.close)
    return built


def _judge_counts(row: dict[str, Any]) -> str:
    if "judge_outputs" not in row or not row["judge_outputs"]:
        return ""
    return f"  [{row['judge_outputs']} outputs: {row['no_verdict']} no verdict, {row['truncated']} cut at the limit]"


@main.group("eval")
def eval_group() -> None:
    """Evaluate judges: ProcessBench, a snapshot's validation split, Best-of-N, chunk-reset."""


@eval_group.command("processbench")
@click.option(
    "--data",
    "files",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    multiple=True,
    required=True,
    help="ProcessBench files (JSON arrays); several after one --data, or --data repeated.",
)
@click.argument("more_files", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--predictions",
    "predictions_file",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Score this JSONL of {id, prediction} instead of running a judge (every sample must have one).",
)
@click.option(
    "--out", "out_dir", type=click.Path(path_type=Path), default=None, help="Write predictions + scores here."
)
@click.option(
    "--tune-threshold-on",
    "tune_file",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Scoring judges: choose the threshold with the best F1 on this ProcessBench file, then score --data with it.",
)
@click.option(
    "--tune-subset",
    "subset_tunes",
    multiple=True,
    metavar="SUBSET=FILE",
    help="Scoring judges: this --data subset (its file's name) gets its own threshold, chosen on FILE.  Repeatable.",
)
@click.option(
    "--oracle-threshold",
    is_flag=True,
    help="Scoring judges: score each subset at the best of 10,000 thresholds on that subset itself (the "
    "outcome-supervised PRM paper's appendix protocol; labelled oracle: it flatters the judge).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Only the first N samples of each file: a quick look (not ProcessBench's figures).",
)
@click.option("--json", "as_json", is_flag=True)
@judge_options
@friendly
def eval_processbench(
    files: tuple[Path, ...],
    more_files: tuple[Path, ...],
    predictions_file: Path | None,
    out_dir: Path | None,
    tune_file: Path | None,
    subset_tunes: tuple[str, ...],
    oracle_threshold: bool,
    limit: int | None,
    as_json: bool,
    spec: JudgeSpec,
) -> None:
    """Predict each sample's first wrong step and score it with the official metric."""
    from stepq.api import evaluate_processbench
    from stepq.trainer.evaluation import processbench as pb

    per_subset = {}
    for given_tune in subset_tunes:
        name, sep, path = given_tune.partition("=")
        if not sep or not Path(path).is_file():
            raise click.BadParameter(
                f"'{given_tune}' is not SUBSET=FILE with an existing FILE", param_hint="--tune-subset"
            )
        per_subset[name] = Path(path)

    given = pb.load_predictions(predictions_file) if predictions_file else None
    with progress_bars() as bar:
        report = evaluate_processbench(
            [*files, *more_files],
            spec,
            predictions=given,
            tune_file=tune_file,
            subset_tune_files=per_subset,
            oracle_threshold=oracle_threshold,
            on_subset=bar,
            limit=limit,
        )
    all_predictions = report.pop("predictions")
    if out_dir is not None:
        pb.write_outputs(out_dir, all_predictions, report)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    if "threshold_protocol" in report:
        each = bool(per_subset) or oracle_threshold
        for r in report["subsets"] if each else [report]:
            if r["threshold_tuned_on"] == pb.ORACLE:
                tuned = "oracle: the best F1 on this subset itself, which flatters the judge"
            else:
                tuned = f"chosen on {r['threshold_tuned_on']}" if r["threshold_tuned_on"] else "given"
            where = f" for {r['subset']}" if each else ""
            click.echo(f"threshold{where} {r['threshold']:.4f} ({tuned})")
    if limit is not None:
        click.echo(f"the first {limit} samples of each file only: a quick look, not ProcessBench's figures")
    writes = "judge_settings" in report
    extra = f" {'outputs':>8} {'no verdict':>10} {'cut':>5}" if writes else ""
    click.echo(f"{'subset':<12} {'samples':>7} {'acc_error':>9} {'acc_correct':>11} {'F1':>6}{extra}")
    for r in report["subsets"]:
        counts = f" {r['judge_outputs']:>8} {r['no_verdict']:>10} {r['truncated']:>5}" if writes else ""
        click.echo(
            f"{r['subset']:<12} {r['samples']:>7} {r['acc_error']:>9.1f} {r['acc_correct']:>11.1f} {r['f1']:>6.1f}"
            f"{counts}"
        )
    if "average_f1" in report:
        click.echo(f"{'average':<12} {'':>7} {'':>9} {'':>11} {report['average_f1']:>6.1f}")
    if writes:
        click.echo("no verdict counts as a rejection: that step is predicted as the first error")


@eval_group.command("snapshot")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True)
@judge_options
@friendly
def eval_snapshot(ref: str, as_json: bool, spec: JudgeSpec) -> None:
    """A judge's accuracy on a snapshot's validation split: per class and balanced."""
    from stepq.trainer.evaluation.validation import validation_accuracy

    db = open_db(load_settings())
    built = build_judge(spec)
    report = {**built.describe(), **validation_accuracy(db, ref, built.judge)}
    click.echo(
        json.dumps(report, indent=2)
        if as_json
        else f"validation of snapshot {ref}: positive {report['accuracy_positive']:.1f}%, "
        f"negative {report['accuracy_negative']:.1f}%, balanced {report['balanced_accuracy']:.1f}% "
        f"({report['rows']} chunks){_judge_counts(report)}"
    )


@eval_group.command("best-of-n")
@click.option("--set", "set_name", required=True, help="A set with several trajectories per problem.")
@click.option("--n", "ns", default="1,2,4,8", show_default=True, help="Values of N, comma-separated.")
@click.option(
    "--aggregate",
    "how",
    type=click.Choice(list(AGGREGATORS)),
    default=None,
    help="How a solution's step scores rank it; default: a stepq PRM's own training aggregate (last for an "
    "ORM, min for asymmetric), min for other judges.  softmin: the step logits' softmin at tau 0.1.",
)
@click.option(
    "--pick",
    "choose",
    type=click.Choice(list(PICKS)),
    default="best",
    show_default=True,
    help="best: the sample whose aggregated score is highest (Best-of-N).  weighted-vote: the answer whose "
    "samples' aggregated scores sum highest (majority vote weighted by the judge).",
)
@click.option("--json", "as_json", is_flag=True)
@judge_options
@friendly
def eval_best_of_n(set_name: str, ns: str, how: str | None, choose: str, as_json: bool, spec: JudgeSpec) -> None:
    """Pick one of N trajectories per problem by its aggregated step scores (a PRM's
    probabilities, or a generative judge's verdicts as 1/0)."""
    from stepq.trainer.evaluation.best_of_n import BestOfNRow

    try:
        wanted = sorted({int(n) for n in ns.split(",")})
    except ValueError:
        raise click.BadParameter(f"'{ns}' is not a comma-separated list of whole numbers", param_hint="--n") from None
    if not wanted or wanted[0] < 1:
        raise click.BadParameter("every N must be at least 1", param_hint="--n")
    report = client().evaluate_best_of_n(set_name, wanted, spec, aggregate=how, choose=choose)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    if note := report["outside_training_range"]:
        click.echo(f"note: {note}")
    click.echo(f"aggregate: {report['aggregate']} ({report['aggregate_from']}); pick: {report['choose']}")
    click.echo(f"{'N':>4} {'judge':>7} {'random':>7} {'majority':>8} {'problems':>8}")
    rows = [BestOfNRow(**r) for r in report["rows"]]
    for r in rows:
        if r.judge is None or r.random is None or r.majority is None:
            click.echo(f"{r.n:>4} {'-':>7} {'-':>7} {'-':>8} {0:>8}  (no problem has {r.n} trajectories)")
            continue
        click.echo(f"{r.n:>4} {r.judge:>7.1f} {r.random:>7.1f} {r.majority:>8.1f} {r.problems:>8}")
    if any(r.problems == 0 for r in rows):
        click.echo(f"more trajectories per problem: stepq generate --set {set_name} --samples {max(r.n for r in rows)}")
    if line := _judge_counts(report):
        click.echo(line.strip() + " (no verdict scores the step 0)")


@eval_group.command("chunk-reset")
@click.option("--set", "set_name", required=True, help="Problems to solve; the set's backend is the policy.")
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Regenerations of a rejected chunk after its first attempt (StepWiser: up to five retries).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@judge_options
@friendly
def eval_chunk_reset(set_name: str, retries: int, seed: int, as_json: bool, spec: JudgeSpec) -> None:
    """Chunk-reset inference with a judge, against plain sampling on the same seeds."""
    from stepq.trainer.evaluation.judges import judge_stats
    from stepq.trainer.evaluation.validation import set_chunk_reset

    built = build_judge(spec)
    settings = load_settings()
    db = open_db(settings)
    note = built.range_note(db, set_name)
    report = set_chunk_reset(db, set_name, built.judge, retries, seed, api_key=settings.openai_api_key or None)
    report = {**built.describe(), **judge_stats(built.judge).as_dict(), "outside_training_range": note, **report}
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    if note:
        click.echo(f"note: {note}")
    for name in ("plain", "chunk_reset"):
        r = report[name]
        click.echo(
            f"{name:<12} accuracy {r['accuracy']:6.1f}%  chunks {r['accepted_chunks']} accepted, "
            f"{r['rejected_chunks']} rejected  tokens {r['tokens']}"
        )
    if line := _judge_counts(report):
        click.echo(line.strip() + " (no verdict rejects the chunk)")


@eval_group.command("step-search")
@click.option("--set", "set_name", required=True, help="Problems to solve; the set's backend is the policy.")
@search_options
@click.option(
    "--baseline",
    type=click.Choice(["greedy", "sampled"]),
    default="greedy",
    show_default=True,
    help="The policy alone: greedy decoding (the method's comparison) or one draw at the candidates' sampling.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@friendly
def eval_step_search(set_name: str, baseline: str, seed: int, as_json: bool, choices: SearchChoices) -> None:
    """Test-time scaling by step search (process-based self-rewarding): several candidates per
    step, the pairwise judge keeps the best; against the policy alone, greedy by default (as
    the method compares), with the tokens each side wrote."""
    from stepq.trainer.evaluation.validation import set_step_search
    from stepq.workers.backends import make_backend
    from stepq.workers.search.search_handler import judge_for

    settings = load_settings()
    key = settings.openai_api_key or None
    judge = judge_for(partial(make_backend, api_key=key), choices.judge_backend, choices.judge_config())
    plan = {
        "width": choices.width,
        "max_turns": choices.max_turns,
        "scoring": choices.scoring,
        "sampling": choices.sampling,
        "baseline": baseline,
    }
    report = {"judge": judge.name, **set_step_search(open_db(settings), set_name, judge, plan, seed, api_key=key)}
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    if note := report.get("note"):
        click.echo(f"note: {note}")
    alone, searched = report["policy_alone"], report["step_search"]
    sampling = alone["sampling"]
    click.echo(
        f"policy alone ({report['baseline']}, T = {sampling['temperature']:g}, top_p = {sampling['top_p']:g}) "
        f"accuracy {alone['accuracy']:6.1f}%  tokens {alone['tokens']}  ({alone['problems']} problems)"
    )
    click.echo(
        f"step search (width {report['width']}, T = {report['sampling']['temperature']:g}) "
        f"accuracy {searched['accuracy']:6.1f}%  tokens {searched['tokens']}  ({searched['problems']} problems)"
    )
    click.echo(
        f"step search: {searched['turns']} turns, {searched['turns_without_a_pick']} without a pick (all candidates "
        f"tied), {searched['answers_without_a_verdict']} judge answers without a verdict (counted for neither), "
        f"{searched['completed_after_max_turns']} completed by the policy after {choices.max_turns} turns"
    )
