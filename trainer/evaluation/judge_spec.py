"""Which judge an evaluation uses, described once (``JudgeSpec``) and built here, so every
evaluation command asks a trained judge the way it was trained.

A generative judge's prompt template, chat template and length limit come from the
``stepq-judge.json`` its training run saved beside it; only what the user sets explicitly
overrides them (``--judge-template``, ``--chat-template/--raw-prompt``, ``--max-tokens``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepq.models import Database
from stepq.models.errors import ConfigError, InputError
from stepq.trainer.evaluation import judges
from stepq.trainer.generative_judge.judge_prompting import JudgeSettings, settings_for_model
from stepq.trainer.generative_judge.training_range import range_note

JUDGE_KINDS = ("model", "prm", "oracle", "label-oracle", "accept-all", "scores")
SCORE_BY = ("verdict", *judges.SCORE_BY)


@dataclass(frozen=True)
class JudgeSpec:
    kind: str = "model"
    backend: str = "hf"
    model: str | None = None
    backend_config: dict[str, Any] = field(default_factory=dict)
    votes: int = 1
    temperature: float | None = None
    """Default: 0 with one vote, 1 with several."""
    max_tokens: int | None = None
    chat_template: bool | None = None
    judge_template: Path | None = None
    score_by: str = "verdict"
    """verdict: the judge's (majority) verdict; votes/logprob: its P(Positive) as a score."""
    scores_file: Path | None = None
    threshold: float = 0.5
    api_key: str | None = field(default=None, repr=False)
    """The openai backend's key (the settings'), unless ``backend_config`` names one."""


@dataclass
class BuiltJudge:
    judge: Any
    settings: JudgeSettings | None
    """How a generative judge is prompted (None for other judges)."""
    close: Callable[[], None] = lambda: None

    @property
    def scoring(self) -> bool:
        """Scores every step (thresholds apply) rather than accepting or rejecting it."""
        return isinstance(self.judge, (judges.ScoringJudge, judges.ScoreJudge))

    def range_note(self, db: Database, set_name: str) -> str | None:
        """A sentence when the set's problems are of a kind the judge was not trained on."""
        return range_note(self.settings.trained_on, db, set_name) if self.settings is not None else None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"judge": getattr(self.judge, "name", "?")}
        if self.settings is not None:
            out["judge_settings"] = {k: v for k, v in self.settings.as_dict().items() if k != "template"}
        return out


def build_judge(spec: JudgeSpec) -> BuiltJudge:
    if spec.kind not in JUDGE_KINDS:
        raise ConfigError(f"unknown judge '{spec.kind}' (one of: {', '.join(JUDGE_KINDS)})")
    if spec.score_by != "verdict" and spec.kind != "model":
        raise ConfigError("--score-by applies to --judge model only (a PRM scores already)")
    if spec.kind == "oracle":
        return BuiltJudge(judges.SyntheticOracle(), None)
    if spec.kind == "label-oracle":
        return BuiltJudge(judges.LabelOracle(), None)
    if spec.kind == "accept-all":
        return BuiltJudge(judges.AcceptAll(), None)
    if spec.kind == "prm":
        if not spec.model:
            raise ConfigError("--judge prm needs --model DIR (a PRM from 'stepq train --method prm')")
        from stepq.trainer.prm.model import StepScorer

        return BuiltJudge(judges.PRMJudge(StepScorer.load(spec.model), spec.threshold), None)
    if spec.kind == "scores":
        if spec.scores_file is None:
            raise ConfigError("--judge scores needs --scores FILE")
        table = load_scores(spec.scores_file)
        return BuiltJudge(judges.ScoreJudge(table, spec.threshold), None)
    return _model_judge(spec)


def _model_judge(spec: JudgeSpec) -> BuiltJudge:
    if not spec.model and spec.backend != "synthetic":
        raise ConfigError(f"--judge model with --backend {spec.backend} needs --model")
    from stepq.workers.backends import SamplingParams, make_backend

    settings = settings_for_model(spec.model).overridden(spec.judge_template, spec.chat_template, spec.max_tokens)
    backend = make_backend(
        spec.backend,
        {"model": spec.model, **spec.backend_config} if spec.model else spec.backend_config,
        api_key=spec.api_key,
    )
    temperature = spec.temperature if spec.temperature is not None else (0.0 if spec.votes == 1 else 1.0)
    model = judges.ModelJudge(
        backend,
        SamplingParams(temperature=temperature, max_tokens=settings.max_tokens),
        prompt=settings.prompt,
        votes=spec.votes,
        chat_template=settings.chat_template,
    )
    judge: Any = model if spec.score_by == "verdict" else judges.GenerativeScorer(model, spec.score_by, spec.threshold)
    return BuiltJudge(judge, settings, backend.close)


def load_scores(path: Path) -> dict[str, list[float]]:
    """A JSONL of {"id", "scores": [one per step]} (a PRM's output written elsewhere)."""
    table: dict[str, list[float]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(str(path), None, None, f"cannot read: {exc.strerror}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            table[str(row["id"])] = [float(x) for x in row["scores"]]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise InputError(str(path), n, "scores", f"expected {{'id', 'scores': [numbers]}}: {exc}") from None
    return table
