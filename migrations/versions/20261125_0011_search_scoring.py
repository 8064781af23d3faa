"""step searches record how candidates are scored

Revision ID: 20261125_0011
Revises: 20261125_0010
Create Date: 2026-11-25 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from stepq.models.base import NAMING_CONVENTION as CONVENTION

revision = "20261125_0011"
down_revision = "20261125_0010"
branch_labels = None
depends_on = None


# Searches started before this revision counted only pairs both orders agreed on: the server
# default keeps that true of them.  New searches name their scoring explicitly (the published
# method's, every comparison's verdict, unless asked otherwise).


def upgrade() -> None:
    op.add_column(
        "step_searches", sa.Column("scoring", sa.String(length=20), server_default="both-orders", nullable=False)
    )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        views: dict[str, str] = dict(bind.execute(sa.text("SELECT name, sql FROM sqlite_master WHERE type = 'view'")).all())
        for name in views:
            op.execute(f"DROP VIEW {name}")
        with op.batch_alter_table("step_searches", naming_convention=CONVENTION) as batch_op:
            batch_op.drop_column("scoring")
        for sql in views.values():
            op.execute(sql)
    else:
        op.drop_column("step_searches", "scoring")
