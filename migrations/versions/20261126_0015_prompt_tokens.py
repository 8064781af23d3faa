"""prompt tokens per rollout: the context a rollout continued, where the engine reports it

Revision ID: 20261126_0015
Revises: 20261126_0014
Create Date: 2026-11-26 05:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "20261126_0015"
down_revision = "20261126_0014"
branch_labels = None
depends_on = None

# A rollout from an early prefix generates many tokens from a short context, one from a late
# prefix few from a long one: ``rollouts.tokens`` counts the first, ``prompt_tokens`` the
# second (NULL where the engine did not say, and for rows written before this revision).
# Nullable, no default: adding it rewrites nothing on either dialect.


def upgrade() -> None:
    op.add_column("rollouts", sa.Column("prompt_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    # SQLite drops a column in place (3.35+); rebuilding the table would trip the views over it
    op.execute("ALTER TABLE rollouts DROP COLUMN prompt_tokens")
