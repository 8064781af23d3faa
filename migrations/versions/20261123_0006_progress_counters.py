"""per-set progress counters kept by triggers, progress samples; dispatcher plans only flagged sets

Revision ID: 20261123_0006
Revises: 20261123_0005
Create Date: 2026-11-23 07:10:00

On PostgreSQL, statement-level triggers with transition tables add every write's deltas to
``set_counters`` / ``label_counters`` in the writing transaction (one upsert per statement,
sharded by backend so concurrent workers do not queue on one row).  ``stepq_recount()``
rebuilds them from the tables (used here to backfill, and by operators after bulk loads).
SQLite (the embedded default) gets the tables but no triggers: status reads the view there.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '20261123_0006'
down_revision = '20261123_0005'
branch_labels = None
depends_on = None

SHARD = "(pg_backend_pid() % 8)::smallint"


def _upsert(table: str, keys: list[str], columns: list[str], source: str) -> str:
    """Add the deltas ``source`` selects (key columns, then ``columns``) to ``table``."""
    cols = ", ".join(columns)
    added = ", ".join(f"{c} = {table}.{c} + EXCLUDED.{c}" for c in columns)
    key_list = ", ".join(keys)
    return (
        f"INSERT INTO {table} ({key_list}, shard, {cols}) "
        f"SELECT {key_list}, {SHARD}, {cols} FROM ({source}) AS deltas "
        f"ON CONFLICT ({key_list}, shard) DO UPDATE SET {added}"
    )


def _set_upsert(columns: list[str], source: str) -> str:
    return _upsert("set_counters", ["problem_set_id"], columns, source)


STATES = ("pending", "queued", "running", "done", "failed")


def _work_deltas(rows: str, sign: str) -> str:
    """Per-set work deltas of the rows in transition table ``rows`` (sign + or -)."""
    states = ", ".join(f"{sign}sum(CASE WHEN w.state = '{s}' THEN 1 ELSE 0 END) AS work_{s}" for s in STATES)
    return (
        f"SELECT p.problem_set_id, {states}, "
        f"{sign}sum(CASE WHEN w.state = 'done' THEN t.n_chunks ELSE 0 END) AS chunks_done, "
        f"{sign}sum(CASE WHEN w.state = 'done' THEN rc.c ELSE 0 END) AS rollouts_done "
        f"FROM {rows} w JOIN trajectories t ON t.id = w.trajectory_id JOIN problems p ON p.id = t.problem_id "
        "LEFT JOIN LATERAL (SELECT count(*) AS c FROM rollouts r "
        "WHERE r.trajectory_id = w.trajectory_id AND w.state = 'done') rc ON true "
        "GROUP BY p.problem_set_id"
    )


WORK_COLUMNS = [f"work_{s}" for s in STATES] + ["chunks_done", "rollouts_done"]

_states_changed = ", ".join(
    f"sum(CASE WHEN n.state = '{s}' THEN 1 ELSE 0 END) - sum(CASE WHEN o.state = '{s}' THEN 1 ELSE 0 END) AS work_{s}"
    for s in STATES
)
WORK_UPDATE = (
    f"SELECT p.problem_set_id, {_states_changed}, "
    "sum(CASE WHEN n.state = 'done' THEN t.n_chunks ELSE 0 END) "
    "- sum(CASE WHEN o.state = 'done' THEN t.n_chunks ELSE 0 END) AS chunks_done, "
    "sum(CASE WHEN n.state = 'done' THEN rc.c ELSE 0 END) - sum(CASE WHEN o.state = 'done' THEN rc.c ELSE 0 END) "
    "AS rollouts_done "
    "FROM new_rows n JOIN old_rows o ON o.id = n.id "
    "JOIN trajectories t ON t.id = n.trajectory_id JOIN problems p ON p.id = t.problem_id "
    "LEFT JOIN LATERAL (SELECT count(*) AS c FROM rollouts r WHERE r.trajectory_id = n.trajectory_id "
    "AND (n.state = 'done') <> (o.state = 'done')) rc ON true "
    "WHERE n.state <> o.state GROUP BY p.problem_set_id"
)


def _rollout_deltas(rows: str, sign: str) -> str:
    return (
        f"SELECT p.problem_set_id, {sign}count(*) AS rollouts, "
        f"{sign}sum(CASE WHEN w.state = 'done' THEN 1 ELSE 0 END) AS rollouts_done "
        f"FROM {rows} r JOIN trajectories t ON t.id = r.trajectory_id JOIN problems p ON p.id = t.problem_id "
        "LEFT JOIN rollout_work w ON w.trajectory_id = r.trajectory_id GROUP BY p.problem_set_id"
    )


def _label_deltas(rows: str, sign: str) -> str:
    return (
        f"SELECT p.problem_set_id, l.rule, {sign}count(*) AS labelled, "
        f"{sign}sum(CASE WHEN l.positive THEN 1 ELSE 0 END) AS positive "
        f"FROM {rows} l JOIN chunks c ON c.id = l.chunk_id JOIN trajectories t ON t.id = c.trajectory_id "
        "JOIN problems p ON p.id = t.problem_id GROUP BY p.problem_set_id, l.rule"
    )


LABEL_UPDATE = (
    "SELECT p.problem_set_id, n.rule, 0 AS labelled, "
    "sum(CASE WHEN n.positive THEN 1 ELSE 0 END) - sum(CASE WHEN o.positive THEN 1 ELSE 0 END) AS positive "
    "FROM new_rows n JOIN old_rows o ON o.id = n.id JOIN chunks c ON c.id = n.chunk_id "
    "JOIN trajectories t ON t.id = c.trajectory_id JOIN problems p ON p.id = t.problem_id "
    "WHERE n.positive <> o.positive GROUP BY p.problem_set_id, n.rule"
)


def _label_upsert(source: str) -> str:
    return _upsert("label_counters", ["problem_set_id", "rule"], ["labelled", "positive"], source)


# (table, event, statement run with the transition tables)
TRIGGERS = [
    ("problems", "INSERT", _set_upsert(
        ["problems"], "SELECT problem_set_id, count(*) AS problems FROM new_rows GROUP BY problem_set_id")),
    ("problems", "DELETE", _set_upsert(
        ["problems"], "SELECT problem_set_id, -count(*) AS problems FROM old_rows GROUP BY problem_set_id")),
    ("trajectories", "INSERT", _set_upsert(
        ["trajectories", "chunks"],
        "SELECT p.problem_set_id, count(*) AS trajectories, sum(n.n_chunks) AS chunks FROM new_rows n "
        "JOIN problems p ON p.id = n.problem_id GROUP BY p.problem_set_id")),
    ("trajectories", "DELETE", _set_upsert(
        ["trajectories", "chunks"],
        "SELECT p.problem_set_id, -count(*) AS trajectories, -sum(o.n_chunks) AS chunks FROM old_rows o "
        "JOIN problems p ON p.id = o.problem_id GROUP BY p.problem_set_id")),
    ("trajectories", "UPDATE", _set_upsert(
        ["chunks"],
        "SELECT p.problem_set_id, sum(n.n_chunks - o.n_chunks) AS chunks FROM new_rows n "
        "JOIN old_rows o ON o.id = n.id JOIN problems p ON p.id = n.problem_id "
        "WHERE n.n_chunks <> o.n_chunks GROUP BY p.problem_set_id")),
    ("rollouts", "INSERT", _set_upsert(["rollouts", "rollouts_done"], _rollout_deltas("new_rows", ""))),
    ("rollouts", "DELETE", _set_upsert(["rollouts", "rollouts_done"], _rollout_deltas("old_rows", "-"))),
    ("rollout_work", "INSERT", _set_upsert(WORK_COLUMNS, _work_deltas("new_rows", ""))),
    ("rollout_work", "DELETE", _set_upsert(WORK_COLUMNS, _work_deltas("old_rows", "-"))),
    ("rollout_work", "UPDATE", _set_upsert(WORK_COLUMNS, WORK_UPDATE)),
    ("chunk_labels", "INSERT", _label_upsert(_label_deltas("new_rows", ""))),
    ("chunk_labels", "DELETE", _label_upsert(_label_deltas("old_rows", "-"))),
    ("chunk_labels", "UPDATE", _label_upsert(LABEL_UPDATE)),
]

RECOUNT = f"""
CREATE FUNCTION stepq_recount() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM set_counters;
    DELETE FROM label_counters;
    INSERT INTO set_counters (problem_set_id, shard, problems) SELECT ps.id, 0,
        (SELECT count(*) FROM problems p WHERE p.problem_set_id = ps.id) FROM problem_sets ps;
    {_set_upsert(["trajectories", "chunks"],
        "SELECT p.problem_set_id, count(*) AS trajectories, sum(t.n_chunks) AS chunks FROM trajectories t "
        "JOIN problems p ON p.id = t.problem_id GROUP BY p.problem_set_id").replace(SHARD, "0")};
    {_set_upsert(["rollouts"], _rollout_deltas("rollouts", "")).replace(SHARD, "0")};
    {_set_upsert(WORK_COLUMNS, _work_deltas("rollout_work", "")).replace(SHARD, "0")};
    {_label_upsert(_label_deltas("chunk_labels", "")).replace(SHARD, "0")};
END $$;
"""


def upgrade() -> None:
    op.add_column('problem_sets', sa.Column('needs_planning', sa.Boolean(), server_default=sa.true(), nullable=False))
    op.create_table('set_counters',
    sa.Column('problem_set_id', sa.Integer(), nullable=False),
    sa.Column('shard', sa.SmallInteger(), nullable=False),
    *[sa.Column(c, sa.BigInteger(), server_default='0', nullable=False) for c in (
        'problems', 'trajectories', 'chunks', 'rollouts', 'work_pending', 'work_queued', 'work_running',
        'work_done', 'work_failed', 'chunks_done', 'rollouts_done')],
    sa.PrimaryKeyConstraint('problem_set_id', 'shard', name=op.f('pk_set_counters'))
    )
    op.create_table('label_counters',
    sa.Column('problem_set_id', sa.Integer(), nullable=False),
    sa.Column('rule', sa.String(length=100), nullable=False),
    sa.Column('shard', sa.SmallInteger(), nullable=False),
    sa.Column('labelled', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('positive', sa.BigInteger(), server_default='0', nullable=False),
    sa.PrimaryKeyConstraint('problem_set_id', 'rule', 'shard', name=op.f('pk_label_counters'))
    )
    op.create_table('progress_samples',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('problem_set_id', sa.Integer(), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('rollouts', sa.BigInteger(), nullable=False),
    sa.Column('trajectories_done', sa.BigInteger(), nullable=False),
    sa.Column('labelled_chunks', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_progress_samples'))
    )
    op.create_index('ix_progress_samples_set_at', 'progress_samples', ['problem_set_id', 'at'])
    op.create_table('event_counts',
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('value', sa.BigInteger(), server_default='0', nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_event_counts'))
    )
    op.add_column('workers', sa.Column('engine_s', sa.Float(), server_default='0', nullable=False))
    op.add_column('workers', sa.Column('grades', sa.JSON(), nullable=True))
    op.create_index('ix_rollout_work_retry_at', 'rollout_work', ['retry_at'])
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, event, statement in TRIGGERS:
        name = f"stepq_count_{table}_{event.lower()}"
        rows = {"INSERT": "NEW TABLE AS new_rows", "DELETE": "OLD TABLE AS old_rows",
                "UPDATE": "OLD TABLE AS old_rows NEW TABLE AS new_rows"}[event]
        op.execute(f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ "
                   f"BEGIN {statement}; RETURN NULL; END $$")
        op.execute(f"CREATE TRIGGER {name} AFTER {event} ON {table} REFERENCING {rows} "
                   f"FOR EACH STATEMENT EXECUTE FUNCTION {name}()")
    op.execute(RECOUNT)
    op.execute("SELECT stepq_recount()")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table, event, _ in TRIGGERS:
            name = f"stepq_count_{table}_{event.lower()}"
            op.execute(f"DROP TRIGGER {name} ON {table}")
            op.execute(f"DROP FUNCTION {name}()")
        op.execute("DROP FUNCTION stepq_recount()")
    op.drop_index('ix_rollout_work_retry_at', 'rollout_work')
    for column in ('grades', 'engine_s'):
        with op.batch_alter_table('workers', schema=None) as batch_op:
            batch_op.drop_column(column)
    op.drop_table('event_counts')
    op.drop_index('ix_progress_samples_set_at', 'progress_samples')
    op.drop_table('progress_samples')
    op.drop_table('label_counters')
    op.drop_table('set_counters')
    with op.batch_alter_table('problem_sets', schema=None) as batch_op:
        batch_op.drop_column('needs_planning')
