"""Start a step search over a problem set: one search row per problem (idempotent: starting
the same search again adds only problems that are new since), then the dispatcher publishes
them; or run them here, without a broker (the embedded default)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.workers.backends import check_storable
from stepq.workers.backends.synthetic import require_synthetic_problems
from stepq.workers.data.prompts import load_template, render
from stepq.workers.data.segmentation import set_cutting_method
from stepq.workers.search.pairwise import EACH_VERDICT, SCORINGS
from stepq.workers.search.search_handler import ORACLE

PAPER_SAMPLING = {"temperature": 0.5, "top_p": 0.95}
"""How the process-based self-rewarding method samples candidate steps (T = 0.5, top_p = 0.95)."""
TEMPLATE_SEGMENTATION = {"step": "step-markers", "chunk": "chunk-tags", "synthetic": "step-markers"}
"""How a policy template's steps are cut, for a set with no trajectories to read it from."""


@dataclass(frozen=True)
class SearchPlan:
    set_name: str
    name: str
    width: int = 6
    max_turns: int = 20
    seed: int = 0
    template: str | None = None
    """Policy template name; default: ``synthetic`` for a synthetic set, else ``step``."""
    judge_backend: str = ORACLE
    judge_config: dict[str, Any] = field(default_factory=dict)
    scoring: str = EACH_VERDICT
    policy_model: str | None = None
    """Sample with this model on the set's backend instead of the set's own."""
    policy_run_id: int | None = None
    """The training run that produced ``policy_model`` (recorded on each search)."""
    sampling: dict[str, Any] = field(default_factory=lambda: dict(PAPER_SAMPLING))
    """Candidate sampling over the set's own settings (which keep ``max_tokens``, ``stop``)."""


def start_search(db: Database, plan: SearchPlan) -> int:
    """Create the searches; returns how many are new."""
    if plan.width < 2:
        raise ConfigError("a step search needs --width of at least 2 (candidates are compared in pairs)")
    if plan.scoring not in SCORINGS:
        raise ConfigError(f"unknown search scoring '{plan.scoring}' (one of: {', '.join(SCORINGS)})")
    if plan.max_turns < 1:
        raise ConfigError("--max-turns must be at least 1")
    check_storable(plan.judge_config, f"search '{plan.name}' judge")
    with db.session() as s:
        pset = queries.get_set(s, plan.set_name)
        if plan.judge_backend == ORACLE and pset.backend != "synthetic":
            raise ConfigError("the synthetic-oracle judge only knows the synthetic policy's problems")
        if plan.policy_model is None:  # the set's own policy must be able to continue its problems
            require_synthetic_problems(s, pset.id, pset.backend, plan.set_name)
        if plan.policy_model is not None and pset.backend not in MODEL_BACKENDS:
            raise ConfigError(f"set '{plan.set_name}' samples with the {pset.backend} backend, which loads no model")
        problems = queries.problems_of_set(s, pset.id)
        if not problems:
            raise ConfigError(f"set '{plan.set_name}' has no problems to search")
        given = {} if plan.template else queries.policy_prompts(s, pset.id)
        name = plan.template or ("synthetic" if pset.backend == "synthetic" else "step")
        template = load_template(name)
        segmentation = set_cutting_method(s, pset.id, plan.set_name) if given else None
        segmentation = segmentation or TEMPLATE_SEGMENTATION.get(name, "auto")
        every = all(pid in given for pid, _ in problems)
        chat = None if every else _chat_template(pset.backend, pset.backend_config, plan)
        rows = [
            {
                "name": plan.name,
                "problem_set_id": pset.id,
                "problem_id": pid,
                # the policy's own prompt where it wrote a trajectory of the problem (its template
                # and chat template, as the pairs' DPO prompt must be); else the template, rendered
                "prompt": given.get(pid) or (chat or str)(render(template, question)),
                "width": plan.width,
                "max_turns": plan.max_turns,
                "seed": plan.seed,
                "judge_backend": plan.judge_backend,
                "judge_config": plan.judge_config,
                "scoring": plan.scoring,
                "policy_model": plan.policy_model,
                "policy_run_id": plan.policy_run_id,
                "segmentation": segmentation,
                "sampling": dict(plan.sampling),
            }
            for pid, question in problems
        ]
        return queries.create_searches(s, rows)


def _chat_template(backend: str, config: dict[str, Any] | None, plan: SearchPlan) -> Callable[[str], str] | None:
    """The policy model's chat template as a function of the user prompt (None where the
    backend applies none): what ``stepq generate`` does to the prompts it samples from."""
    model = plan.policy_model or (config or {}).get("model")
    if backend not in ("hf", "vllm") or not model:
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    if not getattr(tokenizer, "chat_template", None):
        return None

    def apply(user_text: str) -> str:
        messages = [{"role": "user", "content": user_text}]
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    return apply


MODEL_BACKENDS = ("hf", "vllm", "openai")


def next_round(db: Database, plan: SearchPlan, run_ref: str) -> SearchPlan:
    """Round k+1 of the process-based self-rewarding loop: the model that training run
    ``run_ref`` (its id or output folder) produced is both the policy, on the set's backend,
    and the pairwise judge; the searches record the run."""
    from dataclasses import replace

    from stepq.models import queries
    from stepq.models.training import RUN_DONE

    with db.session() as s:
        run = queries.find_run(s, run_ref)
        if run.status != RUN_DONE:
            raise ConfigError(f"training run {run.id} is {run.status}: a round searches with a finished model")
        pset = queries.get_set(s, plan.set_name)
        model = str(Path(run.output_dir) / "final")
        backend, config = pset.backend, dict(pset.backend_config or {})
        run_id = run.id
    if backend not in MODEL_BACKENDS:
        raise ConfigError(f"set '{plan.set_name}' samples with the {backend} backend, which loads no model")
    judge_config = {**config, **plan.judge_config, "model": model}
    return replace(plan, policy_model=model, policy_run_id=run_id, judge_backend=backend, judge_config=judge_config)
