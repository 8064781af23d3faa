"""trainer: snapshots and training runs

Revision ID: 20261123_0004
Revises: 20261122_0003
Create Date: 2026-11-23 02:56:09.666008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '20261123_0004'
down_revision = '20261122_0003'
branch_labels = None
depends_on = None

# One row per snapshot with its class counts per split (operators: what did the trainer eat?).
SNAPSHOT_SUMMARY = """
CREATE VIEW snapshot_summary AS
SELECT
    s.id AS snapshot,
    s.name AS name,
    s.lineage AS lineage,
    s.rule AS label_rule,
    s.balanced AS balanced,
    s.created_at AS created_at,
    sum(CASE WHEN r.split = 'train' AND r.positive THEN 1 ELSE 0 END) AS train_positive,
    sum(CASE WHEN r.split = 'train' AND NOT r.positive THEN 1 ELSE 0 END) AS train_negative,
    sum(CASE WHEN r.split = 'validation' AND r.positive THEN 1 ELSE 0 END) AS validation_positive,
    sum(CASE WHEN r.split = 'validation' AND NOT r.positive THEN 1 ELSE 0 END) AS validation_negative,
    count(DISTINCT CASE WHEN r.split = 'train' THEN r.problem_id END) AS train_problems,
    count(DISTINCT CASE WHEN r.split = 'validation' THEN r.problem_id END) AS validation_problems
FROM snapshots s
LEFT JOIN snapshot_rows r ON r.snapshot_id = s.id
GROUP BY s.id, s.name, s.lineage, s.rule, s.balanced, s.created_at
"""

# One row per training run with its latest logged metrics.
TRAINING_PROGRESS = """
CREATE VIEW training_progress AS
SELECT
    tr.id AS run,
    s.name AS snapshot,
    tr.method AS method,
    tr.lineage AS lineage,
    tr.status AS status,
    tr.global_step AS step,
    tr.max_steps AS max_steps,
    tr.resumes AS resumes,
    tr.last_checkpoint AS last_checkpoint,
    m.reward AS reward,
    m.accuracy_positive AS accuracy_positive,
    m.accuracy_negative AS accuracy_negative,
    m.completion_length AS completion_length,
    m.clip_ratio AS clip_ratio,
    m.entropy AS entropy,
    m.loss AS loss,
    tr.host AS host,
    tr.error AS error
FROM training_runs tr
JOIN snapshots s ON s.id = tr.snapshot_id
LEFT JOIN training_metrics m
    ON m.run_id = tr.id AND m.step = (SELECT max(m2.step) FROM training_metrics m2 WHERE m2.run_id = tr.id)
"""


def upgrade() -> None:
    op.create_table('snapshots',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('lineage', sa.String(length=200), nullable=True),
    sa.Column('rule', sa.String(length=100), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('val_fraction', sa.Float(), nullable=False),
    sa.Column('balanced', sa.Boolean(), nullable=False),
    sa.Column('content_hash', sa.String(length=64), nullable=False),
    sa.Column('manifest', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_snapshots')),
    sa.UniqueConstraint('name', name=op.f('uq_snapshots_name'))
    )
    with op.batch_alter_table('snapshots', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_snapshots_lineage'), ['lineage'], unique=False)

    op.create_table('training_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('snapshot_id', sa.Integer(), nullable=False),
    sa.Column('method', sa.String(length=20), nullable=False),
    sa.Column('lineage', sa.String(length=200), nullable=True),
    sa.Column('recipe', sa.Text(), nullable=False),
    sa.Column('base_model', sa.Text(), nullable=False),
    sa.Column('output_dir', sa.Text(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('host', sa.String(length=200), nullable=False),
    sa.Column('lease_owner', sa.String(length=200), nullable=True),
    sa.Column('lease_expires_at', sa.Float(), nullable=True),
    sa.Column('last_checkpoint', sa.Text(), nullable=True),
    sa.Column('checkpoints', sa.JSON(), nullable=False),
    sa.Column('global_step', sa.Integer(), nullable=False),
    sa.Column('max_steps', sa.Integer(), nullable=True),
    sa.Column('resumes', sa.Integer(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['snapshot_id'], ['snapshots.id'], name=op.f('fk_training_runs_snapshot_id_snapshots')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_training_runs')),
    sa.UniqueConstraint('output_dir', name=op.f('uq_training_runs_output_dir'))
    )
    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_training_runs_lineage'), ['lineage'], unique=False)
        batch_op.create_index(batch_op.f('ix_training_runs_snapshot_id'), ['snapshot_id'], unique=False)

    op.create_table('training_metrics',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('reward', sa.Float(), nullable=True),
    sa.Column('accuracy_positive', sa.Float(), nullable=True),
    sa.Column('accuracy_negative', sa.Float(), nullable=True),
    sa.Column('completion_length', sa.Float(), nullable=True),
    sa.Column('clip_ratio', sa.Float(), nullable=True),
    sa.Column('entropy', sa.Float(), nullable=True),
    sa.Column('loss', sa.Float(), nullable=True),
    sa.Column('values', sa.JSON(), nullable=False),
    sa.Column('logged_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['training_runs.id'], name=op.f('fk_training_metrics_run_id_training_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_training_metrics')),
    sa.UniqueConstraint('run_id', 'step', name=op.f('uq_training_metrics_run_id_step'))
    )
    op.create_table('snapshot_rows',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('snapshot_id', sa.Integer(), nullable=False),
    sa.Column('split', sa.String(length=20), nullable=False),
    sa.Column('chunk_id', sa.Integer(), nullable=False),
    sa.Column('trajectory_id', sa.Integer(), nullable=False),
    sa.Column('problem_id', sa.Integer(), nullable=False),
    sa.Column('chunk_idx', sa.Integer(), nullable=False),
    sa.Column('positive', sa.Boolean(), nullable=False),
    sa.Column('q_before', sa.Float(), nullable=False),
    sa.Column('q_after', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['chunk_id'], ['chunks.id'], name=op.f('fk_snapshot_rows_chunk_id_chunks')),
    sa.ForeignKeyConstraint(['snapshot_id'], ['snapshots.id'], name=op.f('fk_snapshot_rows_snapshot_id_snapshots'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_snapshot_rows')),
    sa.UniqueConstraint('snapshot_id', 'chunk_id', name=op.f('uq_snapshot_rows_snapshot_id_chunk_id'))
    )
    with op.batch_alter_table('snapshot_rows', schema=None) as batch_op:
        batch_op.create_index('ix_snapshot_rows_snapshot_id_split', ['snapshot_id', 'split'], unique=False)
    op.execute(SNAPSHOT_SUMMARY)
    op.execute(TRAINING_PROGRESS)


def downgrade() -> None:
    op.execute("DROP VIEW training_progress")
    op.execute("DROP VIEW snapshot_summary")
    with op.batch_alter_table('snapshot_rows', schema=None) as batch_op:
        batch_op.drop_index('ix_snapshot_rows_snapshot_id_split')

    op.drop_table('snapshot_rows')
    op.drop_table('training_metrics')
    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_training_runs_snapshot_id'))
        batch_op.drop_index(batch_op.f('ix_training_runs_lineage'))

    op.drop_table('training_runs')
    with op.batch_alter_table('snapshots', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_snapshots_lineage'))

    op.drop_table('snapshots')
