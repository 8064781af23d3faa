"""locks record since when their holder holds them

Revision ID: 20261128_0020
Revises: 20261128_0019
Create Date: 2026-11-28 09:00:00

``stepq status`` says whether a dispatcher is alive and since when: a lease renewed every few
seconds says the first, only the time its holder took it says the second.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "20261128_0020"
down_revision = "20261128_0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("locks", sa.Column("acquired_at", sa.Float(), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE locks DROP COLUMN acquired_at")
