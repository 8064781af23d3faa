"""step search: searches as leased queue work, their turns and preference pairs

Revision ID: 20261123_0008
Revises: 20261123_0007
Create Date: 2026-11-23 12:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '20261123_0008'
down_revision = '20261123_0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('step_searches',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('problem_set_id', sa.Integer(), nullable=False),
    sa.Column('problem_id', sa.Integer(), nullable=False),
    sa.Column('prompt', sa.Text(), nullable=False),
    sa.Column('width', sa.Integer(), nullable=False),
    sa.Column('max_turns', sa.Integer(), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('judge_backend', sa.String(length=40), nullable=False),
    sa.Column('judge_config', sa.JSON(), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('lease_owner', sa.String(length=200), nullable=True),
    sa.Column('lease_expires_at', sa.Float(), nullable=True),
    sa.Column('enqueued_at', sa.Float(), nullable=True),
    sa.Column('outcome', sa.String(length=20), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.ForeignKeyConstraint(['problem_id'], ['problems.id'], name=op.f('fk_step_searches_problem_id_problems'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['problem_set_id'], ['problem_sets.id'], name=op.f('fk_step_searches_problem_set_id_problem_sets'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_step_searches')),
    sa.UniqueConstraint('name', 'problem_id', name=op.f('uq_step_searches_name_problem_id'))
    )
    op.create_index('ix_step_searches_state', 'step_searches', ['state'], unique=False)
    op.create_index(op.f('ix_step_searches_problem_set_id'), 'step_searches', ['problem_set_id'], unique=False)
    op.create_table('search_turns',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('search_id', sa.Integer(), nullable=False),
    sa.Column('turn', sa.Integer(), nullable=False),
    sa.Column('prefix', sa.JSON(), nullable=False),
    sa.Column('candidates', sa.JSON(), nullable=False),
    sa.Column('wins', sa.JSON(), nullable=False),
    sa.Column('consistent_pairs', sa.Integer(), nullable=False),
    sa.Column('action', sa.String(length=20), nullable=False),
    sa.Column('chosen', sa.Integer(), nullable=True),
    sa.Column('rejected', sa.Integer(), nullable=True),
    sa.Column('worker', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['search_id'], ['step_searches.id'], name=op.f('fk_search_turns_search_id_step_searches'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_search_turns')),
    sa.UniqueConstraint('search_id', 'turn', name=op.f('uq_search_turns_search_id_turn'))
    )


def downgrade() -> None:
    op.drop_table('search_turns')
    op.drop_index(op.f('ix_step_searches_problem_set_id'), table_name='step_searches')
    op.drop_index('ix_step_searches_state', table_name='step_searches')
    op.drop_table('step_searches')
