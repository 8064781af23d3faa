"""Commands that plan and follow the annotation: annotate, label, retry, status, and the
embedded default ``run``."""

from __future__ import annotations

import json

import click

from stepq.commands.base import (
    backend_config,
    client,
    friendly,
    load_settings,
    main,
    open_db,
)
from stepq.workers.backends import BACKENDS as BACKEND_NAMES


@main.command()
@click.option("--set", "set_name", required=True)
@click.option("--rollouts", "m", type=click.IntRange(min=1), required=True, help="Rollouts per prefix (M).")
@click.option("--rule", default=None, help="Label rule, e.g. abs-q or rel-ratio:gamma=0.7.")
@click.option(
    "--budget",
    default=None,
    help=(
        "exhaustive, or adaptive[:KEY=VALUE,...]: "
        "confidence, min, round, probe, probe_n, settle, prior, link, cost, sib, stop."
    ),
)
@click.option("--backend", type=click.Choice(BACKEND_NAMES), default=None, help="The set's generation backend.")
@click.option("--model", default=None, help="Backend model (path or served name).")
@click.option("--base-url", default=None, help="openai: the server's base URL.")
@click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE")
@click.option("--temperature", type=float, default=None, help="Rollout sampling temperature (default 1.0).")
@click.option("--top-p", type=float, default=None)
@click.option("--max-tokens", type=int, default=None, help="Most new tokens per rollout (default 8192).")
@click.option(
    "--resample",
    is_flag=True,
    help="Discard the set's rollouts, Q-values and labels and sample again (with a changed backend, model or "
    "sampling: the new settings; without the flag such a change is refused).  Safe while workers run: a batch "
    "sampled the old way is never written.",
)
@click.option(
    "--priority",
    default=None,
    metavar="STRATEGY",
    help="Order the set's waiting trajectories: fifo (plan order, the default), random[:seed=S], "
    "uncertainty:run=N|lineage=NAME or convincing-wrong:run=N|lineage=NAME "
    "(options votes=K, score=logprob, threshold=T; convincing-wrong also mirror=yes). "
    "Given again, it re-scores the waiting work with the judge it names now.",
)
@click.option(
    "--priority-aging",
    "priority_aging_s",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Work planned this much earlier goes first whatever the priorities (default 86400): no starvation.",
)
@friendly
def annotate(
    set_name: str,
    m: int,
    rule: str | None,
    budget: str | None,
    backend: str | None,
    model: str | None,
    base_url: str | None,
    backend_options: tuple[str, ...],
    temperature: float | None,
    top_p: float | None,
    max_tokens: int | None,
    resample: bool,
    priority: str | None,
    priority_aging_s: float | None,
) -> None:
    """Set a problem set's budget and plan its missing rollouts (only what is missing)."""
    config = backend_config(model, base_url, backend_options)
    sampling = {
        k: v for k, v in {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}.items() if v is not None
    }
    report = client().annotate(
        set_name,
        m,
        rule=rule,
        budget=budget,
        backend=backend,
        backend_config=config,
        sampling=sampling,
        resample=resample,
        priority=priority,
        priority_aging_s=priority_aging_s,
    )
    click.echo(
        f"set '{set_name}': M={report.rollouts_per_prefix}, rule {report.label_rule}, "
        f"budget {report.budget_policy}; {report.work_items} work items planned or reopened"
    )
    if report.overridden:
        said = ", ".join(f"{name} {old} -> {new}" for name, (old, new) in report.overridden.items())
        click.echo(f"changed the set's settings: {said}")
    ordered = report.ordered
    if ordered is not None and ordered.round_id is None:
        click.echo(f"order: {ordered.strategy} (plan order; {ordered.reset} waiting items reset)")
    elif ordered is not None:
        judge = f" by the judge of training run {ordered.judge_run_id}" if ordered.judge_run_id else ""
        click.echo(
            f"order: {ordered.strategy}; priority round {ordered.round_id}: {ordered.scoring_jobs} scoring jobs "
            f"queued{judge} (workers score the waiting trajectories before their rollouts are published)"
        )


@main.command()
@click.option("--set", "set_name", required=True)
@click.option("--rule", required=True, help="abs-q, rel-ratio[:gamma=G] or rel-effective[:alpha=A].")
@click.option("--default/--no-default", "make_default", default=False, help="Also make it the set's rule.")
@friendly
def label(set_name: str, rule: str, make_default: bool) -> None:
    """Recompute labels for a rule from stored rollouts, without sampling again."""
    from stepq.workers.labelling.labels import parse_rule
    from stepq.workers.labelling.qvalues import relabel_set

    parsed = parse_rule(rule)
    report = relabel_set(open_db(load_settings()), set_name, parsed, make_default=make_default)
    click.echo(f"set '{set_name}': {report.labelled} chunks labelled under {parsed.key}")
    if report.undecided:
        click.echo(
            f"{report.undecided} chunks need more rollouts under this rule and budget: "
            f"run 'stepq annotate --set {set_name} --rollouts M --rule {parsed.key}'"
        )


@main.command()
@click.option("--set", "set_name", required=True)
@click.option(
    "--only",
    type=click.Choice(["timeouts", "errors", "all"]),
    default="timeouts",
    show_default=True,
    help="timeouts: answers whose grading timed out; errors: also those math-verify failed on; all: every rollout.",
)
@friendly
def regrade(set_name: str, only: str) -> None:
    """Re-grade stored answers (no sampling) and update Q-values and labels."""
    from stepq.workers.grading.grader import Grader
    from stepq.workers.labelling.regrade import regrade_set

    settings = load_settings()
    grader = Grader(timeout_s=settings.grade_timeout_s)
    try:
        report = regrade_set(open_db(settings), set_name, grader, only=only)
    finally:
        grader.close()
    methods = ", ".join(f"{k} {v}" for k, v in sorted(report.methods.items())) or "none"
    click.echo(
        f"set '{set_name}': {report.examined} rollouts re-graded ({methods}); {report.changed} rewards changed "
        f"in {report.trajectories} trajectories, whose Q-values and labels were recomputed"
    )
    if report.unavailable:
        click.echo(f"{report.unavailable} rollouts kept neither text nor answer: nothing to re-grade")


@main.command()
@click.option("--set", "set_name", default=None, help="Only this problem set (default: all).")
@friendly
def retry(set_name: str | None) -> None:
    """Give failed jobs of every kind (work items, step searches, priority scorings) another
    round of attempts (after fixing what made them fail)."""
    from stepq.models import queries
    from stepq.workers.kinds import retry_failed

    database = open_db(load_settings())
    with database.session() as s:
        set_id = queries.get_set(s, set_name).id if set_name else None
        counts = retry_failed(s, set_id)
    click.echo(f"{counts.pop('rollouts', 0)} failed work items are pending again")
    for table, count in counts.items():
        if count:
            click.echo(f"{count} failed {RETRIED.get(table, table + ' jobs')} are pending again")


RETRIED = {"searches": "step searches", "scorings": "priority scoring jobs"}
"""How ``stepq retry`` names each kind's jobs (any other kind: by its table)."""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Redraw every --interval seconds until Ctrl-C.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True)
@click.option("-v", "--verbose", is_flag=True, help="Every column (budget, tokens, savings, retrying...).")
@friendly
def status(as_json: bool, watch: bool, interval: float, verbose: bool) -> None:
    """Progress per problem set: rollouts done/planned, labels, rate, ETA, troubles, workers."""
    from stepq.status import collect, render
    from stepq.status import watch as watch_status
    from stepq.workers.jobqueue.broker_contents import redis_queue_depth

    settings = load_settings()
    database = open_db(settings)
    depth = redis_queue_depth(settings.broker_url, settings.queue) if not settings.embedded else None
    if watch:
        try:
            watch_status(database, interval_s=interval, queue_depth=depth, echo=click.echo)
        except KeyboardInterrupt:
            return
    report = collect(database, depth)
    click.echo(json.dumps(report, indent=2) if as_json else render(report, verbose))


@main.command()
@click.option("--set", "set_name", default="demo", show_default=True)
@click.option(
    "--synthetic",
    "n_synth",
    type=click.IntRange(min=0),
    default=None,
    help="Synthetic problems to create when the set does not exist yet (the quick start's 'demo' set: 50). "
    "Without it, a named set that does not exist is an error, not a new set.",
)
@click.option(
    "--rollouts",
    "m",
    type=click.IntRange(min=1),
    default=None,
    help="Rollouts per prefix (default: the set's, 8 for a new set).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--rule", default=None, help="Label rule (default: the set's, abs-q for a new set).")
@click.option("--budget", default=None, help="exhaustive or adaptive[:...] (default: the set's).")
@friendly
def run(set_name: str, n_synth: int | None, m: int | None, seed: int, rule: str | None, budget: str | None) -> None:
    """The embedded default: problems to labels in this process (SQLite, no services)."""
    from stepq.embedded import run_embedded

    # not through the API object: 'stepq run' creates and migrates the file itself, after
    # checking that no other run holds it
    run_embedded(load_settings(), set_name, n_synth=n_synth, m=m, seed=seed, rule=rule, budget=budget, echo=click.echo)
