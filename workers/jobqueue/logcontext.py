"""What a log line is about: the worker, the set and the work item, carried in a context
variable so every line a task logs (its own, the backend's, the grader's) can say it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

LOG_CONTEXT: ContextVar[dict[str, Any]] = ContextVar("stepq_log_context", default={})  # noqa: B039


@contextmanager
def bind(**fields: Any) -> Iterator[None]:
    """Add fields to every log line written inside the block (this thread or task)."""
    token = LOG_CONTEXT.set({**LOG_CONTEXT.get(), **fields})
    try:
        yield
    finally:
        LOG_CONTEXT.reset(token)
