"""What a worker process does its work with, kept warm between tasks: the grader, the
generation backends (each set's policy, a search's judge, or the worker's own engine) and the
judge factory priority scoring asks.

Kept apart from the queue's machinery (``jobqueue``: claiming, holding, settling jobs), which
never generates or grades and imports only the models; the handlers reach these through
``rt.engines``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepq.models.problems import ProblemSet
from stepq.workers.backends import GenerationBackend, make_backend
from stepq.workers.grading.grader import Grader


@dataclass
class Engines:
    grader: Grader = field(default_factory=Grader)
    override: GenerationBackend | None = None
    """The worker's own engine, used for every set instead of the set's policy."""
    owns_override: bool = False
    """Close the override with the engines (a worker's engine: its processes must stop too)."""
    judge_factory: Callable[[int, Any], Any] | None = None
    """Priority scoring's judge for a training run id and a round's strategy: the trainer's
    (``stepq.trainer.evaluation.scoring_judges``, handed down by whoever assembles the process,
    so the workers never import the trainer), or a stand-in (tests, benchmarks)."""
    openai_api_key: str = field(default="", repr=False)
    """The openai backend's key (``STEPQ_OPENAI_API_KEY``), unless a set's config names one."""
    _backends: dict[str, GenerationBackend] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.generator = self.override.generator if self.override else "per-set"
        """The generator last used, for the heartbeat (``stepq status`` shows it)."""

    def backend_for(self, pset: ProblemSet) -> GenerationBackend:
        """The set's policy (or the worker's own engine), kept warm across tasks."""
        if self.override is not None:
            return self.override
        backend = self.backend_named(pset.backend, pset.backend_config)
        self.generator = backend.generator
        return backend

    def backend_named(self, name: str, config: dict[str, Any]) -> GenerationBackend:
        """A backend by name and config, built once per process (a judge's, a set's)."""
        key = name + json.dumps(config, sort_keys=True)
        if key not in self._backends:
            self._backends[key] = make_backend(name, config, api_key=self.openai_api_key or None)
        return self._backends[key]

    def close(self) -> None:
        for backend in self._backends.values():
            backend.close()
        self._backends.clear()
        if self.owns_override and self.override is not None:
            self.override.close()
        self.grader.close()
