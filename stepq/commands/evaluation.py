"""CLI commands that evaluate judges: ProcessBench, a snapshot's validation split, Best-of-N
and chunk-reset, with any judge (a generative model on any backend, a trained PRM, a scores
file, the oracles).  Importing the module registers them on ``stepq``."""

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

JUDGES = ("model", "prm", "oracle", "label-oracle", "accept-all", "scores")


@contextmanager
def progress(total: int, what: str) -> Iterator[Callable[[int], None]]:
    """A progress bar with ETA on a terminal (plain when not a terminal)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda n: bar.advance(task, n)


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
        click.option(
            "--threshold", type=float, default=0.5, show_default=True, help="--judge prm|scores: accept a step at this."
        ),
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
    if kind == "prm":
        if not kw["model"]:
            raise ConfigError("--judge prm needs --model DIR (a PRM from 'stepq train --method prm')")
        from stepq.trainer.prm.model import StepScorer

        return judges.PRMJudge(StepScorer.load(kw["model"]), kw["threshold"])
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
    # An engine's processes must stop for the command to exit: close it when the command ends,
    # whether it returns or fails.
    click.get_current_context().call_on_close(backend.close)
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
@click.option(
    "--tune-threshold-on",
    "tune_file",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="--judge prm: choose the threshold with the best F1 on this ProcessBench file, then score --data with it.",
)
@click.option("--json", "as_json", is_flag=True)
@judge_options
@friendly
def eval_processbench(
    files: tuple[Path, ...],
    predictions_file: Path | None,
    out_dir: Path | None,
    tune_file: Path | None,
    as_json: bool,
    **kw: Any,
) -> None:
    """Predict each sample's first wrong step and score it with the official metric."""
    from stepq.trainer.evaluation import processbench as pb

    given = pb.load_predictions(predictions_file) if predictions_file else None
    judge = None if given is not None else build_judge(kw)
    scoring = judge is not None and hasattr(judge, "score_solutions")
    if tune_file is not None and not scoring:
        raise ConfigError("--tune-threshold-on needs a scoring judge (--judge prm)")
    threshold = kw["threshold"]
    if tune_file is not None:
        tune = pb.load_samples(tune_file)
        threshold = pb.choose_threshold(pb.sample_scores(judge, tune), {s["id"]: s["label"] for s in tune})
    scores, all_predictions = [], {}
    predictions: dict[str, Any]
    for path in files:
        samples = pb.load_samples(path)
        if given is not None:
            predictions = {s["id"]: given.get(s["id"]) for s in samples}
        elif scoring:
            predictions = dict(pb.predictions_at(pb.sample_scores(judge, samples), threshold))
        else:
            assert judge is not None
            with progress(len(samples), f"{path.stem}") as advance:
                predictions = dict(pb.predict(judge, samples, advance))
        all_predictions.update(predictions)
        scores.append(pb.score(pb.subset_name(path), {s["id"]: s["label"] for s in samples}, predictions))
    report: dict[str, Any] = {
        "judge": kw["judge"] if given is None else "predictions",
        "subsets": [s.as_dict() for s in scores],
    }
    if scoring:
        report["threshold"] = threshold
        report["threshold_tuned_on"] = pb.subset_name(tune_file) if tune_file else None
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
    if scoring:
        tuned = f"chosen on {report['threshold_tuned_on']}" if tune_file else "given"
        click.echo(f"threshold {threshold:.4f} ({tuned})")
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
    "--aggregate",
    "how",
    type=click.Choice(["min", "mean", "geomean", "product", "last"]),
    default="min",
    show_default=True,
)
@click.option("--json", "as_json", is_flag=True)
@judge_options
@friendly
def eval_best_of_n(set_name: str, ns: str, how: str, as_json: bool, **kw: Any) -> None:
    """Pick one of N trajectories per problem by its aggregated step scores (a PRM's
    probabilities, or a generative judge's verdicts as 1/0)."""
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
