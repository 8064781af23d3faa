"""convincing-wrong keeps its mirror where a set or round had it

Revision ID: 20261202_0021
Revises: 20261128_0020
Create Date: 2026-12-02 14:00:00

``convincing-wrong`` now means PRM800K's strategy alone (wrong answers the judge rates highly);
the mirror it used to include (right answers rated low) is the option ``mirror=yes``.  A set
ordered by it before this revision, and the record of every round that did, is spelled with
the option, so upgrading changes no set's order and no round's record.  A downgrade removes
the option again; a set ordered without the mirror cannot be said in the old spelling, so it
is refused rather than silently given the mirror.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "20261202_0021"
down_revision = "20261128_0020"
branch_labels = None
depends_on = None

_TABLES = (("problem_sets", "priority_strategy"), ("priority_rounds", "strategy"))
_OPTION = ",mirror=yes"


def upgrade() -> None:
    # every convincing-wrong spelling names its judge (run= or lineage=), so it has a ':'
    for table, column in _TABLES:
        op.execute(
            sa.text(f"UPDATE {table} SET {column} = {column} || :option WHERE {column} LIKE 'convincing-wrong:%'")
            .bindparams(option=_OPTION)
        )


def downgrade() -> None:
    conn = op.get_bind()
    for table, column in _TABLES:
        plain = conn.execute(
            sa.text(f"SELECT count(*) FROM {table} WHERE {column} LIKE 'convincing-wrong:%' AND {column} NOT LIKE :opt")
            .bindparams(opt="%" + _OPTION)
        ).scalar()
        if plain:
            raise RuntimeError(
                f"{plain} row(s) of {table} order by convincing-wrong without its mirror, which the older "
                "revision cannot express: set them to another strategy first (stepq annotate --priority ...)"
            )
    for table, column in _TABLES:
        op.execute(
            sa.text(
                f"UPDATE {table} SET {column} = substr({column}, 1, length({column}) - :n) "
                f"WHERE {column} LIKE 'convincing-wrong:%' AND {column} LIKE :opt"
            ).bindparams(n=len(_OPTION), opt="%" + _OPTION)
        )
