"""The problems a judge learnt from, kept with it, so an evaluation on problems of another kind
says so: a judge taught on one range of numbers can be brittle a little outside it (the
spelled judge taught on small numbers made chunk-reset *worse* on the default ones, rejecting
81% of chunks), and nothing in a model folder otherwise tells which range that was.

Recorded as plain descriptions of the snapshot's sets (name, backend and, for a synthetic
set, its numbers) in ``stepq-judge.json``; compared with the evaluated set's own description.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepq.models import Database, queries

SYNTHETIC_DEFAULT_NUMBERS = "default"


def describe_sets(db: Database, names: Sequence[str]) -> tuple[dict[str, Any], ...]:
    """What a judge trained on these sets learnt from, for its settings file."""
    with db.session() as session:
        return tuple(_describe(queries.get_set(session, name)) for name in names)


def snapshot_sets(db: Database, snapshot: str | int) -> tuple[dict[str, Any], ...]:
    with db.session() as session:
        names = list(queries.get_snapshot(session, snapshot).manifest.get("sets", []))
    return describe_sets(db, names)


def range_note(trained_on: Sequence[dict[str, Any]], db: Database, set_name: str) -> str | None:
    """A sentence when ``set_name``'s problems are of a kind none of the judge's training sets
    were (another synthetic range, or another backend's problems); None when they match or the
    judge's training is unknown (a judge trained elsewhere)."""
    if not trained_on:
        return None
    here = describe_sets(db, [set_name])[0]
    if any(_kind(t) == _kind(here) for t in trained_on):
        return None
    learnt = ", ".join(f"'{t['set']}' ({_words(t)})" for t in trained_on)
    return (
        f"set '{set_name}' holds {_words(here)}; the judge was trained on {learnt}: "
        "outside its training range, its verdicts may not carry over"
    )


def _describe(pset: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"set": pset.name, "backend": pset.backend}
    if pset.backend == "synthetic":
        out["numbers"] = (pset.backend_config or {}).get("numbers", SYNTHETIC_DEFAULT_NUMBERS)
    return out


def _kind(described: dict[str, Any]) -> tuple[str, str | None]:
    """Synthetic sets are of one kind per range of numbers; any other set is of the non-synthetic kind."""
    if described.get("backend") == "synthetic":
        return ("synthetic", described.get("numbers", SYNTHETIC_DEFAULT_NUMBERS))
    return ("other", None)


def _words(described: dict[str, Any]) -> str:
    if described.get("backend") == "synthetic":
        return f"synthetic problems of {described.get('numbers', SYNTHETIC_DEFAULT_NUMBERS)} numbers"
    return "problems that are not synthetic"
