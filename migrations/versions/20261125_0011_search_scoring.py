"""step searches record how candidates are scored, and which model (trained by which run) searched

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
    bind = op.get_bind()
    op.add_column(
        "step_searches", sa.Column("scoring", sa.String(length=20), server_default="both-orders", nullable=False)
    )
    op.add_column("step_searches", sa.Column("policy_model", sa.Text(), nullable=True))
    if bind.dialect.name == "sqlite":  # SQLite adds a foreign key only by rebuilding the table
        views: dict[str, str] = dict(bind.execute(sa.text("SELECT name, sql FROM sqlite_master WHERE type = 'view'")).all())
        for name in views:
            op.execute(f"DROP VIEW {name}")
        with op.batch_alter_table("step_searches", naming_convention=CONVENTION) as batch_op:
            _add_policy_run(batch_op)
        for sql in views.values():
            op.execute(sql)
    else:
        with op.batch_alter_table("step_searches", naming_convention=CONVENTION) as batch_op:
            _add_policy_run(batch_op)


def _add_policy_run(batch_op: object) -> None:
    batch_op.add_column(sa.Column("policy_run_id", sa.Integer(), nullable=True))  # type: ignore[attr-defined]
    batch_op.create_foreign_key(  # type: ignore[attr-defined]
        "fk_step_searches_policy_run_id_training_runs", "training_runs", ["policy_run_id"], ["id"], ondelete="SET NULL"
    )
    batch_op.create_index("ix_step_searches_policy_run_id", ["policy_run_id"])  # type: ignore[attr-defined]


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        views: dict[str, str] = dict(bind.execute(sa.text("SELECT name, sql FROM sqlite_master WHERE type = 'view'")).all())
        for name in views:
            op.execute(f"DROP VIEW {name}")
        with op.batch_alter_table("step_searches", naming_convention=CONVENTION) as batch_op:
            batch_op.drop_index("ix_step_searches_policy_run_id")
            batch_op.drop_column("policy_run_id")
            batch_op.drop_column("policy_model")
            batch_op.drop_column("scoring")
        for sql in views.values():
            op.execute(sql)
    else:
        op.drop_index("ix_step_searches_policy_run_id", table_name="step_searches")
        op.drop_constraint("fk_step_searches_policy_run_id_training_runs", "step_searches", type_="foreignkey")
        for column in ("policy_run_id", "policy_model", "scoring"):
            op.drop_column("step_searches", column)
