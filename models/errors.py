"""The one exception tree for errors a user should see as a message, not a traceback.

It lives in the lowest layer because every layer raises these, and only here; the CLI
(``stepq.commands.base.friendly``) turns each into a one-line message and an exit code.
"""

from __future__ import annotations

import re

_CREDENTIALS = re.compile(r"(//[^:@/\s]*:)[^/\s]*@")  # to the last @ of the userinfo: a raw @ in a password
_SECRET_PARAMS = re.compile(
    r"([?&;](?:password|passwd|pwd|pass|secret|token|access_token|api_key|apikey|sslpassword)=)[^&;\s#'\"]+",
    re.IGNORECASE,
)


def masked(text: str) -> str:
    """``text`` with every URL password (``//user:PASSWORD@``, or a query parameter such as
    ``?password=...``) replaced by ``***``: the one filter every message, error and log line
    passes before it is printed, so a URL with a secret (well-formed or not) never reaches a
    terminal or a container log."""
    return _SECRET_PARAMS.sub(r"\1***", _CREDENTIALS.sub(r"\1***@", text))


_CAUSES = (
    (("lock timeout",), "a lock wait timed out (another transaction holds the rows)"),
    (("statement timeout",), "a statement timed out"),
    (("idle-in-transaction",), "a transaction sat idle past its timeout"),
    (("no space left on device", "could not extend file", "disk full", "misconf"), "the server's disk is full"),
    (("out of memory", "oom command not allowed", "maxmemory"), "the server is out of memory (full)"),
    (("database is locked",), "the SQLite file is locked by another process"),
    (("read only", "read-only"), "the server accepts no writes (read-only)"),
)


_MISSING = re.compile(r'\b(database|role) "([^"]*)" does not exist', re.IGNORECASE)


def missing_on_server(text: str) -> str | None:
    """What to do when PostgreSQL refused the connection because the URL names a database or a
    user it does not have: both read "does not exist", which is not "not migrated" (the tables
    are missing) and not "unreachable"; None for any other error."""
    found = _MISSING.search(text)
    if found is None:
        return None
    kind, name = found.group(1).lower(), found.group(2)
    if kind == "database":
        return (
            f"database '{name}' does not exist on the server: create it (createdb {name}, "
            f"or CREATE DATABASE {name}), then run 'stepq db upgrade'"
        )
    return (
        f"user '{name}' does not exist on the server: create it (createuser {name}, "
        f"or CREATE ROLE {name} LOGIN), or name another user in STEPQ_DATABASE_URL"
    )


def cause_of(text: str) -> str:
    """What an error from the database or the broker says happened, in a few words: a lock
    timeout, a full disk or a full memory reported as "unreachable" sent operators to the network."""
    missing = missing_on_server(text)
    if missing is not None:
        return missing
    lowered = text.lower()
    for needles, cause in _CAUSES:
        if any(n in lowered for n in needles):
            return cause
    return "unreachable"


class StepqError(Exception):
    """Base of every user-facing error; ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class ConfigError(StepqError):
    """A setting or option is missing or malformed."""

    exit_code = 2


class InputError(StepqError):
    """A user-supplied file is malformed; names the file, line and field."""

    exit_code = 3

    def __init__(self, path: str, line: int | None, field: str | None, reason: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.reason = reason
        where = path if line is None else f"{path}:{line}"
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{reason}")


class SourceUnavailable(StepqError):
    """A data source that cannot be reached now (a dataset hub offline or unreachable): not the
    file's fault, not a typo in an option; trying again later, or from a cache, may work."""

    exit_code = 66  # EX_NOINPUT


class NotFoundError(StepqError):
    """A named object (problem set, work item) does not exist."""

    exit_code = 4


class DatabaseError(StepqError):
    """The database cannot be reached or is not migrated."""

    exit_code = 5


class BrokerError(StepqError):
    """The message broker cannot be reached."""

    exit_code = 6


class WorkFailed(StepqError):
    """A run ended with work items failed: the labels are incomplete (``stepq retry``)."""

    exit_code = 7


class Busy(StepqError):
    """Another process holds what this command needs (a dispatcher, a training run): try later."""

    exit_code = 75  # EX_TEMPFAIL


class Interrupted(StepqError):
    """An operator stopped the command (Ctrl-C): the work in hand went back to pending, no
    attempt spent; running the command again resumes."""

    exit_code = 130  # 128 + SIGINT, as shells report it


class TrainingBusy(Busy):
    """Another process holds a training run's lease (it is training it now): try later."""


class GenerationError(StepqError):
    """A backend could not generate.  ``permanent`` errors (a context longer than the
    model's limit, an HTTP 400) fail their work item at once with the message; transient
    ones (a timeout, a 5xx, a refused connection) are retried with backoff."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class LeaseLost(StepqError):
    """Another process took over work this process held; stop writing for it."""


class WrongGenerator(ConfigError):
    """This worker generates otherwise than the set it was handed (another model or sampling).
    A fleet worker refuses the set's work, which goes back for a worker that matches; alone
    (the embedded runner), nobody else could take it: the item fails, saying why."""


class Superseded(StepqError):
    """The set was resampled while this process sampled it the old way: its batch is not
    written, and the job goes back to be sampled the new way."""
