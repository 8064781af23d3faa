"""initial schema

Revision ID: 20261122_0001
Revises: 
Create Date: 2026-11-22 10:49:32.192042
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '20261122_0001'
down_revision = None
branch_labels = None
depends_on = None

# Operator views. Plain SQL that runs on PostgreSQL and SQLite alike; a later change
# to a view is a new revision that drops and recreates it.
ANNOTATION_PROGRESS = """
CREATE VIEW annotation_progress AS
WITH traj AS (
    SELECT p.problem_set_id AS set_id, t.id AS trajectory_id, t.n_chunks
    FROM trajectories t JOIN problems p ON p.id = t.problem_id
)
SELECT
    ps.name AS problem_set,
    ps.rollouts_per_prefix AS rollouts_per_prefix,
    ps.label_rule AS label_rule,
    ps.budget_policy AS budget_policy,
    (SELECT count(*) FROM problems p WHERE p.problem_set_id = ps.id) AS problems,
    (SELECT count(*) FROM traj WHERE traj.set_id = ps.id) AS trajectories,
    (SELECT coalesce(sum(traj.n_chunks), 0) FROM traj WHERE traj.set_id = ps.id) AS chunks,
    (SELECT count(*) FROM rollouts r JOIN traj ON traj.trajectory_id = r.trajectory_id
        WHERE traj.set_id = ps.id) AS rollouts_done,
    (SELECT coalesce(sum(traj.n_chunks), 0) FROM traj WHERE traj.set_id = ps.id)
        * ps.rollouts_per_prefix AS rollouts_planned,
    (SELECT count(*) FROM chunk_labels l
        JOIN chunks c ON c.id = l.chunk_id
        JOIN traj ON traj.trajectory_id = c.trajectory_id
        WHERE traj.set_id = ps.id AND l.rule = ps.label_rule) AS labelled_chunks,
    (SELECT avg(CASE WHEN l.positive THEN 1.0 ELSE 0.0 END) FROM chunk_labels l
        JOIN chunks c ON c.id = l.chunk_id
        JOIN traj ON traj.trajectory_id = c.trajectory_id
        WHERE traj.set_id = ps.id AND l.rule = ps.label_rule) AS positive_share
FROM problem_sets ps
"""

CHUNK_Q_VALUES = """
CREATE VIEW chunk_q_values AS
SELECT
    ps.name AS problem_set,
    p.external_id AS problem,
    t.id AS trajectory_id,
    c.id AS chunk_id,
    c.idx AS chunk,
    t.n_chunks AS n_chunks,
    qb.q AS q_before,
    qa.q AS q_after,
    qb.n_samples AS samples_before,
    qa.n_samples AS samples_after,
    l.rule AS label_rule,
    CASE WHEN l.id IS NULL THEN NULL WHEN l.positive THEN 'positive' ELSE 'negative' END AS label,
    c.ground_truth AS ground_truth
FROM chunks c
JOIN trajectories t ON t.id = c.trajectory_id
JOIN problems p ON p.id = t.problem_id
JOIN problem_sets ps ON ps.id = p.problem_set_id
LEFT JOIN q_values qb ON qb.trajectory_id = t.id AND qb.prefix_len = c.idx - 1
LEFT JOIN q_values qa ON qa.trajectory_id = t.id AND qa.prefix_len = c.idx
LEFT JOIN chunk_labels l ON l.chunk_id = c.id AND l.rule = ps.label_rule
"""

WORK_QUEUE = """
CREATE VIEW work_queue AS
SELECT
    ps.name AS problem_set,
    w.state AS state,
    count(*) AS items,
    sum(w.attempts) AS attempts,
    min(w.enqueued_at) AS oldest_enqueued_at
FROM rollout_work w
JOIN trajectories t ON t.id = w.trajectory_id
JOIN problems p ON p.id = t.problem_id
JOIN problem_sets ps ON ps.id = p.problem_set_id
GROUP BY ps.name, w.state
"""

VIEWS = {
    "annotation_progress": ANNOTATION_PROGRESS,
    "chunk_q_values": CHUNK_Q_VALUES,
    "work_queue": WORK_QUEUE,
}


def upgrade() -> None:
    op.create_table('locks',
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('expires_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_locks'))
    )
    op.create_table('problem_sets',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('rollouts_per_prefix', sa.Integer(), server_default='0', nullable=False),
    sa.Column('label_rule', sa.String(length=100), server_default='abs-q', nullable=False),
    sa.Column('budget_policy', sa.String(length=40), server_default='exhaustive', nullable=False),
    sa.Column('backend', sa.String(length=40), server_default='synthetic', nullable=False),
    sa.Column('backend_config', sa.JSON(), nullable=False),
    sa.Column('sampling', sa.JSON(), nullable=False),
    sa.Column('seed', sa.Integer(), server_default='0', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_problem_sets')),
    sa.UniqueConstraint('name', name=op.f('uq_problem_sets_name'))
    )
    op.create_table('workers',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('hostname', sa.String(length=200), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('backend', sa.String(length=200), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.Column('last_heartbeat', sa.Float(), nullable=False),
    sa.Column('rollouts_done', sa.Integer(), nullable=False),
    sa.Column('tokens_done', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_workers'))
    )
    op.create_table('problems',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('problem_set_id', sa.Integer(), nullable=False),
    sa.Column('external_id', sa.String(length=200), nullable=False),
    sa.Column('question', sa.Text(), nullable=False),
    sa.Column('reference_answer', sa.Text(), nullable=False),
    sa.Column('meta', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.ForeignKeyConstraint(['problem_set_id'], ['problem_sets.id'], name=op.f('fk_problems_problem_set_id_problem_sets'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_problems')),
    sa.UniqueConstraint('problem_set_id', 'external_id', name=op.f('uq_problems_problem_set_id_external_id'))
    )
    with op.batch_alter_table('problems', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_problems_problem_set_id'), ['problem_set_id'], unique=False)

    op.create_table('trajectories',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('problem_id', sa.Integer(), nullable=False),
    sa.Column('source_key', sa.String(length=200), nullable=False),
    sa.Column('prompt', sa.Text(), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('final_answer', sa.Text(), nullable=True),
    sa.Column('outcome', sa.Boolean(), nullable=True),
    sa.Column('n_chunks', sa.Integer(), nullable=False),
    sa.Column('segmentation', sa.String(length=40), nullable=False),
    sa.Column('generator', sa.String(length=200), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.ForeignKeyConstraint(['problem_id'], ['problems.id'], name=op.f('fk_trajectories_problem_id_problems'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_trajectories')),
    sa.UniqueConstraint('problem_id', 'source_key', name=op.f('uq_trajectories_problem_id_source_key'))
    )
    with op.batch_alter_table('trajectories', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_trajectories_problem_id'), ['problem_id'], unique=False)

    op.create_table('chunks',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('trajectory_id', sa.Integer(), nullable=False),
    sa.Column('idx', sa.Integer(), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('ground_truth', sa.Boolean(), nullable=True),
    sa.ForeignKeyConstraint(['trajectory_id'], ['trajectories.id'], name=op.f('fk_chunks_trajectory_id_trajectories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_chunks')),
    sa.UniqueConstraint('trajectory_id', 'idx', name=op.f('uq_chunks_trajectory_id_idx'))
    )
    op.create_table('q_values',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('trajectory_id', sa.Integer(), nullable=False),
    sa.Column('prefix_len', sa.Integer(), nullable=False),
    sa.Column('n_samples', sa.Integer(), nullable=False),
    sa.Column('n_correct', sa.Integer(), nullable=False),
    sa.Column('q', sa.Float(), nullable=False),
    sa.Column('source', sa.String(length=20), nullable=False),
    sa.ForeignKeyConstraint(['trajectory_id'], ['trajectories.id'], name=op.f('fk_q_values_trajectory_id_trajectories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_q_values')),
    sa.UniqueConstraint('trajectory_id', 'prefix_len', name=op.f('uq_q_values_trajectory_id_prefix_len'))
    )
    op.create_table('rollout_work',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('trajectory_id', sa.Integer(), nullable=False),
    sa.Column('target_m', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('enqueue_count', sa.Integer(), nullable=False),
    sa.Column('enqueued_at', sa.Float(), nullable=True),
    sa.Column('lease_owner', sa.String(length=200), nullable=True),
    sa.Column('lease_expires_at', sa.Float(), nullable=True),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['trajectory_id'], ['trajectories.id'], name=op.f('fk_rollout_work_trajectory_id_trajectories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rollout_work')),
    sa.UniqueConstraint('trajectory_id', name=op.f('uq_rollout_work_trajectory_id'))
    )
    with op.batch_alter_table('rollout_work', schema=None) as batch_op:
        batch_op.create_index('ix_rollout_work_state', ['state'], unique=False)

    op.create_table('rollouts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('trajectory_id', sa.Integer(), nullable=False),
    sa.Column('prefix_len', sa.Integer(), nullable=False),
    sa.Column('sample_idx', sa.Integer(), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('final_answer', sa.Text(), nullable=True),
    sa.Column('reward', sa.SmallInteger(), nullable=False),
    sa.Column('tokens', sa.Integer(), nullable=False),
    sa.Column('generator', sa.String(length=200), nullable=False),
    sa.Column('worker', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.ForeignKeyConstraint(['trajectory_id'], ['trajectories.id'], name=op.f('fk_rollouts_trajectory_id_trajectories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rollouts')),
    sa.UniqueConstraint('trajectory_id', 'prefix_len', 'sample_idx', name=op.f('uq_rollouts_trajectory_id_prefix_len_sample_idx'))
    )
    with op.batch_alter_table('rollouts', schema=None) as batch_op:
        batch_op.create_index('ix_rollouts_created_at', ['created_at'], unique=False)

    op.create_table('chunk_labels',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('chunk_id', sa.Integer(), nullable=False),
    sa.Column('rule', sa.String(length=100), nullable=False),
    sa.Column('positive', sa.Boolean(), nullable=False),
    sa.Column('q_before', sa.Float(), nullable=False),
    sa.Column('q_after', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['chunk_id'], ['chunks.id'], name=op.f('fk_chunk_labels_chunk_id_chunks'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_chunk_labels')),
    sa.UniqueConstraint('chunk_id', 'rule', name=op.f('uq_chunk_labels_chunk_id_rule'))
    )
    for sql in VIEWS.values():
        op.execute(sql)


def downgrade() -> None:
    for name in VIEWS:
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_table('chunk_labels')
    with op.batch_alter_table('rollouts', schema=None) as batch_op:
        batch_op.drop_index('ix_rollouts_created_at')

    op.drop_table('rollouts')
    with op.batch_alter_table('rollout_work', schema=None) as batch_op:
        batch_op.drop_index('ix_rollout_work_state')

    op.drop_table('rollout_work')
    op.drop_table('q_values')
    op.drop_table('chunks')
    with op.batch_alter_table('trajectories', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_trajectories_problem_id'))

    op.drop_table('trajectories')
    with op.batch_alter_table('problems', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_problems_problem_set_id'))

    op.drop_table('problems')
    op.drop_table('workers')
    op.drop_table('problem_sets')
    op.drop_table('locks')
