"""pinned budget specs: problem_sets.budget_policy holds every adaptive parameter

Revision ID: 20261123_0009
Revises: 20261123_0008
Create Date: 2026-11-23 23:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "20261123_0009"
down_revision = "20261123_0008"
branch_labels = None
depends_on = None

# A set's budget is stored with all its parameters spelled out, so a later release that
# changes the adaptive defaults does not change the meaning of a set planned before it.
# That needs more than 40 characters.  Views read problem_sets: PostgreSQL will not change
# the type of a column a view selects, and SQLite's table rebuild trips over any view of
# the table, so the views are dropped and recreated from their own stored definitions.


def _views() -> dict[str, str]:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        rows = bind.execute(sa.text("SELECT name, sql FROM sqlite_master WHERE type = 'view' ORDER BY name"))
        return {name: sql for name, sql in rows}
    rows = bind.execute(
        sa.text(
            "SELECT viewname, definition FROM pg_views WHERE schemaname = current_schema() "
            "AND viewname = 'annotation_progress'"
        )
    )
    return {name: f"CREATE VIEW {name} AS {definition}" for name, definition in rows}


def _retype(length: int, previous: int) -> None:
    views = _views()
    for name in views:
        op.execute(f"DROP VIEW {name}")
    with op.batch_alter_table("problem_sets", schema=None) as batch_op:
        batch_op.alter_column(
            "budget_policy",
            existing_type=sa.String(length=previous),
            type_=sa.String(length=length),
            existing_nullable=False,
            existing_server_default="exhaustive",
        )
    for sql in views.values():
        op.execute(sql)


def upgrade() -> None:
    _retype(200, 40)


def downgrade() -> None:
    # A pinned spec does not fit the old column; such sets fall back to the plain adaptive
    # defaults, which is what the old release read them as.
    op.execute("UPDATE problem_sets SET budget_policy = 'adaptive' WHERE length(budget_policy) > 40")
    _retype(40, 200)
