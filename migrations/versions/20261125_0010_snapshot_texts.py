"""snapshot texts: a snapshot keeps the question and chunks it was labelled on

Revision ID: 20261125_0010
Revises: 20261123_0009
Create Date: 2026-11-25 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from stepq.models.base import NAMING_CONVENTION as CONVENTION

revision = "20261125_0010"
down_revision = "20261123_0009"
branch_labels = None
depends_on = None


# Existing snapshots get the text their trajectories hold now: the best record there is of
# what they were labelled on.  snapshot_rows.chunk_id stops being a foreign key: with the
# text kept, a re-segmented trajectory or an updated question no longer needs to be refused
# to keep a snapshot whole.  SQLite rebuilds the table to drop it, and its rebuild trips
# over any view of the table, so its views are dropped and recreated from their own SQL.


def upgrade() -> None:
    op.create_table(
        "snapshot_texts",
        sa.Column("snapshot_id", sa.Integer(), nullable=False),
        sa.Column("trajectory_id", sa.Integer(), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("chunks", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["snapshot_id"], ["snapshots.id"], name=op.f("fk_snapshot_texts_snapshot_id_snapshots"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("snapshot_id", "trajectory_id", name=op.f("pk_snapshot_texts")),
    )
    bind = op.get_bind()
    pairs = bind.execute(sa.text("SELECT DISTINCT snapshot_id, trajectory_id FROM snapshot_rows")).all()
    texts: dict[int, tuple[str, list[str]]] = {}
    for tid in sorted({t for _, t in pairs}):
        rows = bind.execute(
            sa.text(
                "SELECT p.question, c.text FROM trajectories t JOIN problems p ON p.id = t.problem_id "
                "JOIN chunks c ON c.trajectory_id = t.id WHERE t.id = :tid ORDER BY c.idx"
            ),
            {"tid": tid},
        ).all()
        if rows:
            texts[tid] = (rows[0][0], [r[1] for r in rows])
    table = sa.table(
        "snapshot_texts",
        sa.column("snapshot_id", sa.Integer),
        sa.column("trajectory_id", sa.Integer),
        sa.column("question", sa.Text),
        sa.column("chunks", sa.JSON),
    )
    values = [
        {"snapshot_id": s, "trajectory_id": t, "question": texts[t][0], "chunks": texts[t][1]}
        for s, t in pairs
        if t in texts
    ]
    if values:
        op.bulk_insert(table, values)
    if bind.dialect.name == "sqlite":
        views: dict[str, str] = dict(bind.execute(sa.text("SELECT name, sql FROM sqlite_master WHERE type = 'view'")).all())
        for name in views:
            op.execute(f"DROP VIEW {name}")
        with op.batch_alter_table("snapshot_rows", naming_convention=CONVENTION, recreate="always") as batch_op:
            batch_op.drop_constraint("fk_snapshot_rows_chunk_id_chunks", type_="foreignkey")
        for sql in views.values():
            op.execute(sql)
    else:
        op.drop_constraint("fk_snapshot_rows_chunk_id_chunks", "snapshot_rows", type_="foreignkey")


def downgrade() -> None:
    bind = op.get_bind()
    # rows whose chunk is gone cannot point at it again
    op.execute("DELETE FROM snapshot_rows WHERE chunk_id NOT IN (SELECT id FROM chunks)")
    if bind.dialect.name == "sqlite":
        views: dict[str, str] = dict(bind.execute(sa.text("SELECT name, sql FROM sqlite_master WHERE type = 'view'")).all())
        for name in views:
            op.execute(f"DROP VIEW {name}")
        with op.batch_alter_table("snapshot_rows", naming_convention=CONVENTION, recreate="always") as batch_op:
            batch_op.create_foreign_key("fk_snapshot_rows_chunk_id_chunks", "chunks", ["chunk_id"], ["id"])
        for sql in views.values():
            op.execute(sql)
    else:
        op.create_foreign_key("fk_snapshot_rows_chunk_id_chunks", "snapshot_rows", "chunks", ["chunk_id"], ["id"])
    op.drop_table("snapshot_texts")
