"""Dialect-aware statements every query module shares: an INSERT that can ignore or
update on conflict (PostgreSQL and SQLite spell it alike), an idempotent bulk insert and a
bulk upsert."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session


def _insert(session: Session, model: Any) -> Any:
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(model)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(model)


def insert_ignore(session: Session, model: Any, rows: Sequence[dict[str, Any]]) -> int:
    """Insert rows, skipping those that hit a unique key; returns how many were new."""
    if not rows:
        return 0
    # Core executemany compiles once and batches rows into multi-VALUES statements; RETURNING
    # (not rowcount, on which drivers disagree) counts the rows that were new.
    table = model.__table__
    stmt = _insert(session, table).on_conflict_do_nothing().returning(*table.primary_key.columns)
    return len(session.connection().execute(stmt, list(rows)).all())


def upsert(
    session: Session, model: Any, rows: Sequence[dict[str, Any]], keys: Sequence[str], columns: Sequence[str]
) -> None:
    """Insert rows, or overwrite ``columns`` of the row with the same ``keys`` (a unique key)."""
    if not rows:
        return
    stmt = _insert(session, model.__table__)
    stmt = stmt.on_conflict_do_update(index_elements=list(keys), set_={k: stmt.excluded[k] for k in columns})
    session.connection().execute(stmt, list(rows))
