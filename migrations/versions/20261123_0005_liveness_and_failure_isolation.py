"""worker liveness, bounded dispatch, failure isolation, grading methods, paused sets

Revision ID: 20261123_0005
Revises: 20261123_0004
Create Date: 2026-11-23 07:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '20261123_0005'
down_revision = '20261123_0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMNs (no batch copy on SQLite, which would trip over the views).
    op.add_column('workers', sa.Column('busy_items', sa.Integer(), server_default='0', nullable=False))
    op.add_column('workers', sa.Column('label', sa.String(length=200), server_default='', nullable=False))
    op.add_column('workers', sa.Column('stopped_at', sa.Float(), nullable=True))
    op.add_column('rollout_work', sa.Column('retry_at', sa.Float(), nullable=True))
    op.add_column('rollout_work', sa.Column('rerun', sa.Boolean(), server_default=sa.false(), nullable=False))
    op.add_column('rollouts', sa.Column('grade_method', sa.String(length=20), nullable=True))
    op.add_column('problem_sets', sa.Column('paused', sa.Boolean(), server_default=sa.false(), nullable=False))
    op.create_index('ix_rollout_work_state_id', 'rollout_work', ['state', 'id'])
    op.create_index('ix_rollout_work_state_lease', 'rollout_work', ['state', 'lease_expires_at'])
    op.create_index('ix_rollout_work_state_enqueued', 'rollout_work', ['state', 'enqueued_at'])
    op.create_index('ix_rollouts_grade_method', 'rollouts', ['grade_method'])


def downgrade() -> None:
    op.drop_index('ix_rollouts_grade_method', 'rollouts')
    op.drop_index('ix_rollout_work_state_enqueued', 'rollout_work')
    op.drop_index('ix_rollout_work_state_lease', 'rollout_work')
    op.drop_index('ix_rollout_work_state_id', 'rollout_work')
    for table, column in (
        ('problem_sets', 'paused'),
        ('rollouts', 'grade_method'),
        ('rollout_work', 'rerun'),
        ('rollout_work', 'retry_at'),
        ('workers', 'stopped_at'),
        ('workers', 'label'),
        ('workers', 'busy_items'),
    ):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column(column)
