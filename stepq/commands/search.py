"""``stepq search``: step search with a pairwise judge, as queue work (start, run, status).

Importing the module registers the commands on ``stepq``."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import click

from stepq.commands.base import backend_config, friendly, load_settings, main, open_db
from stepq.workers.backends import BACKENDS as BACKEND_NAMES

ORACLE = "synthetic-oracle"


@main.group()
def search() -> None:
    """Step search: sample candidate next steps, rank them with a pairwise judge, keep the best
    and record (best, worst) as a step preference pair."""


@dataclass(frozen=True)
class SearchChoices:
    """How a step search samples and judges, as the options give it (``search_options``)."""

    width: int
    max_turns: int
    scoring: str
    temperature: float
    top_p: float
    judge_backend: str
    judge_model: str | None
    judge_base_url: str | None
    judge_options: tuple[str, ...]
    judge_verdict_by: str

    @property
    def sampling(self) -> dict[str, float]:
        return {"temperature": self.temperature, "top_p": self.top_p}

    def judge_config(self, model_judge: bool = False) -> dict[str, Any]:
        """The pairwise judge's backend config: none for the synthetic oracle, unless
        ``model_judge`` (a round whose judge is a trained model, named elsewhere)."""
        if self.judge_backend == ORACLE and not model_judge:
            return {}
        config = backend_config(self.judge_model, self.judge_base_url, self.judge_options)
        if self.judge_verdict_by != "text":
            config["verdict_by"] = self.judge_verdict_by
        return config


def search_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a step search (its width, turns, scoring, candidates' sampling and
    pairwise judge), shared by 'search start' and 'eval step-search'; the command receives
    them as one ``choices: SearchChoices``."""
    options = [
        click.option("--width", type=click.IntRange(min=2), default=6, show_default=True, help="Candidates per step."),
        click.option("--max-turns", type=click.IntRange(min=1), default=20, show_default=True),
        click.option(
            "--scoring",
            type=click.Choice(["each-verdict", "both-orders"]),
            default="each-verdict",
            show_default=True,
            help="each-verdict: each pair asked once, a candidate scores the candidates it beats (the method's); "
            "both-orders: asked both ways, a pair counts only when both answers agree (stricter, twice the "
            "questions).",
        ),
        click.option(
            "--temperature",
            type=click.FloatRange(min=0.0),
            default=0.5,
            show_default=True,
            help="Candidate steps' sampling temperature (the method's 0.5); max tokens and stops stay the set's.",
        ),
        click.option(
            "--top-p",
            type=click.FloatRange(0.0, 1.0, min_open=True),
            default=0.95,
            show_default=True,
            help="Candidate steps' nucleus sampling (the method's 0.95).",
        ),
        click.option(
            "--judge-backend",
            type=click.Choice([ORACLE, *BACKEND_NAMES]),
            default=ORACLE,
            show_default=True,
            help="The pairwise judge: a model on a backend, or the synthetic policy's oracle.",
        ),
        click.option("--judge-model", default=None),
        click.option("--judge-base-url", default=None),
        click.option("--judge-option", "judge_options", multiple=True, metavar="KEY=VALUE"),
        click.option(
            "--judge-verdict-by",
            type=click.Choice(["text", "logprob"]),
            default="text",
            show_default=True,
            help="A model judge's answer: its written [[A]]/[[B]], or the more probable of the two (no generation).",
        ),
    ]
    names = [f.name for f in fields(SearchChoices)]

    @functools.wraps(fn)
    def with_choices(*args: Any, **kwargs: Any) -> Any:
        choices = SearchChoices(**{name: kwargs.pop(name) for name in names})
        return fn(*args, choices=choices, **kwargs)

    for option in reversed(options):
        with_choices = option(with_choices)
    return with_choices


@search.command("start")
@click.option("--set", "set_name", required=True)
@click.option("--name", required=True, help="The search's name (its pairs are exported by it).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--template",
    default=None,
    help="Policy template; default: the prompt the set's policy trajectories were sampled from (template and chat "
    "template), else synthetic for synthetic sets and step for others.",
)
@search_options
@click.option(
    "--from-run",
    default=None,
    metavar="RUN",
    help="A round of the self-rewarding loop: the model training run RUN (id or output folder) produced is the "
    "policy (on the set's backend) and the judge; each search records the run.",
)
@friendly
def search_start(
    set_name: str, name: str, seed: int, template: str | None, from_run: str | None, choices: SearchChoices
) -> None:
    """Create one search per problem of the set; the dispatcher publishes them to workers
    (or run them here with 'stepq search run')."""
    from stepq.workers.search.plan import SearchPlan, next_round, start_search

    plan = SearchPlan(
        set_name,
        name,
        choices.width,
        choices.max_turns,
        seed,
        template,
        choices.judge_backend,
        choices.judge_config(model_judge=from_run is not None),
        choices.scoring,
        sampling=choices.sampling,
    )
    db = open_db(load_settings())
    if from_run is not None:
        plan = next_round(db, plan, from_run)
    created = start_search(db, plan)
    by = f", policy and judge from training run {plan.policy_run_id}" if plan.policy_run_id else ""
    click.echo(f"search '{name}' on set '{set_name}': {created} new searches (one per problem){by}")


@search.command("run")
@friendly
def search_run() -> None:
    """Run every pending search in this process (the embedded default; no broker)."""
    from stepq.assembly import configured_runtime, kinds_of
    from stepq.workers.in_process import run_searches_here
    from stepq.workers.search.search_handler import SEARCHES

    settings = load_settings()
    db = open_db(settings)
    rt = configured_runtime(settings, db)
    try:
        (kind,) = kinds_of(settings, [SEARCHES])
        outcomes = run_searches_here(db, rt, kind)
    finally:
        rt.close()
    click.echo("searches: " + (", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) or "none pending"))
    if outcomes.get("failed"):  # a search that failed must not read as done (its pairs are missing)
        from stepq.models import jobs
        from stepq.models.errors import WorkFailed
        from stepq.models.search import STEP_SEARCHES

        with db.session() as s:
            errors = [e["last_error"] for e in jobs.troubles(s, STEP_SEARCHES).values() if e["last_error"]]
        latest = f" (latest error: {errors[0].splitlines()[0]})" if errors else ""
        raise WorkFailed(
            f"{outcomes['failed']} step searches failed{latest}; fix the cause, then 'stepq retry' and "
            "'stepq search run' again"
        )


@search.command("status")
@click.option("--json", "as_json", is_flag=True)
@friendly
def search_status(as_json: bool) -> None:
    """Per search: searches by state, turns, pairs, order-consistent judgements and the judge's
    answers without a verdict (cut before [[A]]/[[B]]: they count for neither candidate)."""
    from stepq.models import queries

    with open_db(load_settings()).session() as s:
        rows = queries.search_progress(s)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(
        f"{'search':<20} {'pending':>7} {'queued':>6} {'running':>7} {'done':>5} {'failed':>6} {'turns':>6} "
        f"{'pairs':>6} {'no-verdict':>10}"
    )
    for r in rows:
        click.echo(
            f"{r['search']:<20} {r.get('pending', 0):>7} {r.get('queued', 0):>6} {r.get('running', 0):>7} "
            f"{r.get('done', 0):>5} {r.get('failed', 0):>6} {r['turns']:>6} {r['pairs']:>6} {r['unanswered']:>10}"
        )
