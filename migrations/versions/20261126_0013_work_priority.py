"""work priority: a set's strategy orders its rollout work; priority rounds and judge scorings record who ordered what

Revision ID: 20261126_0013
Revises: 20261125_0012
Create Date: 2026-11-26 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "20261126_0013"
down_revision = "20261125_0012"
branch_labels = None
depends_on = None

# Rollout work keeps its trajectory's set (backfilled here) so the dispatcher reads each set's
# next jobs from one index range, in ``dispatch_key`` order.  Work planned before this
# revision keeps its id order: its key is 0 for all, and ties go by id.  The new columns are
# plain integers and floats (no foreign keys), so SQLite adds them without rebuilding the
# table and its counter views.



def _work_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("problem_set_id", sa.Integer(), server_default="0", nullable=False),
        sa.Column("planned_at", sa.Float(), server_default="0", nullable=False),
        sa.Column("priority", sa.Float(), server_default="0", nullable=False),
        sa.Column("dispatch_key", sa.Float(), server_default="0", nullable=False),
        sa.Column("priority_round_id", sa.Integer(), nullable=True),
    ]


def upgrade() -> None:
    op.add_column(
        "problem_sets", sa.Column("priority_strategy", sa.String(200), server_default="fifo", nullable=False)
    )
    op.add_column("problem_sets", sa.Column("priority_aging_s", sa.Float(), server_default="86400", nullable=False))
    for column in _work_columns():
        op.add_column("rollout_work", column)
    op.execute(
        "UPDATE rollout_work SET problem_set_id = (SELECT p.problem_set_id FROM trajectories t "
        "JOIN problems p ON p.id = t.problem_id WHERE t.id = rollout_work.trajectory_id)"
    )
    op.create_index("ix_rollout_work_dispatch", "rollout_work", ["problem_set_id", "state", "dispatch_key", "id"])
    op.create_table(
        "priority_rounds",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "problem_set_id", sa.Integer(), sa.ForeignKey("problem_sets.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("strategy", sa.String(200), nullable=False),
        sa.Column(
            "judge_run_id", sa.Integer(), sa.ForeignKey("training_runs.id", ondelete="SET NULL"), nullable=True
        ),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("rollouts_before", sa.Integer(), nullable=False),
        sa.Column("labelled_before", sa.Integer(), nullable=False),
        sa.Column("covered_to_id", sa.Integer(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
    )
    op.create_index("ix_priority_rounds_problem_set_id", "priority_rounds", ["problem_set_id"])
    op.create_index("ix_priority_rounds_judge_run_id", "priority_rounds", ["judge_run_id"])
    op.create_table(
        "priority_scorings",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "round_id", sa.Integer(), sa.ForeignKey("priority_rounds.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column(
            "problem_set_id", sa.Integer(), sa.ForeignKey("problem_sets.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("work_from_id", sa.Integer(), nullable=False),
        sa.Column("work_to_id", sa.Integer(), nullable=False),
        sa.Column("scored", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("enqueue_count", sa.Integer(), nullable=False),
        sa.Column("enqueued_at", sa.Float(), nullable=True),
        sa.Column("lease_owner", sa.String(200), nullable=True),
        sa.Column("lease_expires_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("retry_at", sa.Float(), nullable=True),
        sa.Column("rerun", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.create_index("ix_priority_scorings_state_id", "priority_scorings", ["state", "id"])
    op.create_index("ix_priority_scorings_round_id", "priority_scorings", ["round_id"])
    op.create_index("ix_priority_scorings_problem_set_id", "priority_scorings", ["problem_set_id"])


def downgrade() -> None:
    op.drop_table("priority_scorings")
    op.drop_table("priority_rounds")
    op.drop_index("ix_rollout_work_dispatch", "rollout_work")
    bind = op.get_bind()
    views: dict[str, str] = {}
    if bind.dialect.name == "sqlite":  # dropping a column rebuilds the table under its views
        views = dict(bind.execute(sa.text("SELECT name, sql FROM sqlite_master WHERE type = 'view'")).all())
        for name in views:
            op.execute(f"DROP VIEW {name}")
    with op.batch_alter_table("rollout_work") as batch_op:
        for column in _work_columns():
            batch_op.drop_column(column.name)
    with op.batch_alter_table("problem_sets") as batch_op:
        batch_op.drop_column("priority_aging_s")
        batch_op.drop_column("priority_strategy")
    for sql in views.values():
        op.execute(sql)
