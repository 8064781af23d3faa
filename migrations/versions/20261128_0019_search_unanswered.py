"""search turns count the judge's answers without a verdict

Revision ID: 20261128_0019
Revises: 20261126_0018
Create Date: 2026-11-28 08:00:00

An answer cut before its ``[[A]]``/``[[B]]`` (the judge's token limit) counts for neither
candidate; a search now says how many there were instead of folding them into ties.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "20261128_0019"
down_revision = "20261126_0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("search_turns", sa.Column("unanswered", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    op.execute("ALTER TABLE search_turns DROP COLUMN unanswered")
