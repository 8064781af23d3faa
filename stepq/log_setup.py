"""Logging for the command line: plain text, or JSON lines (``STEPQ_LOG_FORMAT=json``) with
the worker, set and work item on every line, for log shippers and ``jq``."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from stepq.models.errors import masked
from stepq.workers.jobqueue.logcontext import LOG_CONTEXT

CONTEXT_FIELDS = ("worker", "set", "item")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, worker, set, item (null when
    the line is about none), and the exception when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        context = LOG_CONTEXT.get()
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": masked(record.getMessage()),
        }
        for name in CONTEXT_FIELDS:
            line[name] = getattr(record, name, context.get(name))
        if record.exc_info:
            line["exception"] = masked(self.formatException(record.exc_info))
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """The plain format, its secrets masked."""

    def format(self, record: logging.LogRecord) -> str:
        return masked(super().format(record))


def setup_logging(level: str, fmt: str = "text") -> None:
    """Configure the root logger once for a command (Celery's own loggers included)."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
