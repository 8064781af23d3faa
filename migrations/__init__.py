"""Alembic environment and revisions; ``upgrade`` is what ``stepq db upgrade`` runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config

HERE = Path(__file__).resolve().parent


def alembic_config(database_url: str) -> Config:
    """An Alembic config that needs no ini file, so the installed package can migrate."""
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade(database_url: str, revision: str = "head", connection: Any = None) -> None:
    """Migrate the database; ``connection``: on this open connection (an in-memory database,
    which a new connection would not see)."""
    cfg = alembic_config(database_url)
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, revision)


def current(database_url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
