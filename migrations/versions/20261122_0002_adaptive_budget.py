"""adaptive budget

Revision ID: 20261122_0002
Revises: 20261122_0001
Create Date: 2026-11-22 11:22:00.664185
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '20261122_0002'
down_revision = '20261122_0001'
branch_labels = None
depends_on = None


# annotation_progress gains trajectories_done and rollouts_saved: for trajectories whose work
# is done, the rollouts an exhaustive budget would have drawn (chunks x M) minus those drawn.
ANNOTATION_PROGRESS = """
CREATE VIEW annotation_progress AS
WITH traj AS (
    SELECT p.problem_set_id AS set_id, t.id AS trajectory_id, t.n_chunks,
           CASE WHEN w.state = 'done' THEN 1 ELSE 0 END AS done
    FROM trajectories t
    JOIN problems p ON p.id = t.problem_id
    LEFT JOIN rollout_work w ON w.trajectory_id = t.id
)
SELECT
    ps.name AS problem_set,
    ps.rollouts_per_prefix AS rollouts_per_prefix,
    ps.label_rule AS label_rule,
    ps.budget_policy AS budget_policy,
    (SELECT count(*) FROM problems p WHERE p.problem_set_id = ps.id) AS problems,
    (SELECT count(*) FROM traj WHERE traj.set_id = ps.id) AS trajectories,
    (SELECT coalesce(sum(traj.done), 0) FROM traj WHERE traj.set_id = ps.id) AS trajectories_done,
    (SELECT coalesce(sum(traj.n_chunks), 0) FROM traj WHERE traj.set_id = ps.id) AS chunks,
    (SELECT count(*) FROM rollouts r JOIN traj ON traj.trajectory_id = r.trajectory_id
        WHERE traj.set_id = ps.id) AS rollouts_done,
    (SELECT coalesce(sum(traj.n_chunks), 0) FROM traj WHERE traj.set_id = ps.id)
        * ps.rollouts_per_prefix AS rollouts_planned,
    (SELECT coalesce(sum(traj.n_chunks), 0) FROM traj WHERE traj.set_id = ps.id AND traj.done = 1)
        * ps.rollouts_per_prefix
        - (SELECT count(*) FROM rollouts r JOIN traj ON traj.trajectory_id = r.trajectory_id
            WHERE traj.set_id = ps.id AND traj.done = 1) AS rollouts_saved,
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


def upgrade() -> None:
    with op.batch_alter_table('rollout_work', schema=None) as batch_op:
        batch_op.add_column(sa.Column('trajectory_is_sample', sa.Boolean(), nullable=True))
    op.execute("DROP VIEW annotation_progress")
    op.execute(ANNOTATION_PROGRESS)



def downgrade() -> None:
    import importlib

    previous = importlib.import_module("migrations.versions.20261122_0001_initial_schema")
    op.execute("DROP VIEW annotation_progress")
    op.execute(previous.ANNOTATION_PROGRESS)
    with op.batch_alter_table('rollout_work', schema=None) as batch_op:
        batch_op.drop_column('trajectory_is_sample')

