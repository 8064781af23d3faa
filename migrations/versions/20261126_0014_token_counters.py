"""per-set token counters: the trigger-kept counters add up the generated tokens of a set's rollouts

Revision ID: 20261126_0014
Revises: 20261126_0013
Create Date: 2026-11-26 00:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "20261126_0014"
down_revision = "20261126_0013"
branch_labels = None
depends_on = None

# GPU time is paid in tokens, not rollouts: ``set_counters.tokens`` sums ``rollouts.tokens`` per
# set, kept by the same statement-level triggers as the rollout counts (their functions are
# replaced here, the triggers stay), so ``stepq status`` and the metrics read tokens at the
# cost of the other counters.  ``stepq_recount()`` learns the column too.  SQLite has no
# triggers: status sums the rollouts there (small, embedded runs).  Self-contained on purpose:
# a revision does not import another's helpers.

SHARD = "(pg_backend_pid() % 8)::smallint"


def _rollout_upsert(rows: str, sign: str, shard: str, with_tokens: bool) -> str:
    tokens = f", {sign}coalesce(sum(r.tokens), 0) AS tokens" if with_tokens else ""
    columns = "rollouts, rollouts_done" + (", tokens" if with_tokens else "")
    added = ", ".join(f"{c} = set_counters.{c} + EXCLUDED.{c}" for c in columns.split(", "))
    return (
        f"INSERT INTO set_counters (problem_set_id, shard, {columns}) "
        f"SELECT problem_set_id, {shard}, {columns} FROM ("
        f"SELECT p.problem_set_id, {sign}count(*) AS rollouts, "
        f"{sign}sum(CASE WHEN w.state = 'done' THEN 1 ELSE 0 END) AS rollouts_done{tokens} "
        f"FROM {rows} r JOIN trajectories t ON t.id = r.trajectory_id JOIN problems p ON p.id = t.problem_id "
        "LEFT JOIN rollout_work w ON w.trajectory_id = r.trajectory_id GROUP BY p.problem_set_id) AS deltas "
        f"ON CONFLICT (problem_set_id, shard) DO UPDATE SET {added}"
    )


def _replace_rollout_triggers(with_tokens: bool) -> None:
    for event, rows, sign in (("insert", "new_rows", ""), ("delete", "old_rows", "-")):
        statement = _rollout_upsert(rows, sign, SHARD, with_tokens)
        op.execute(
            f"CREATE OR REPLACE FUNCTION stepq_count_rollouts_{event}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN {statement}; RETURN NULL; END $$"
        )


def upgrade() -> None:
    op.add_column("set_counters", sa.Column("tokens", sa.BigInteger(), server_default="0", nullable=False))
    if op.get_bind().dialect.name != "postgresql":
        return
    _replace_rollout_triggers(with_tokens=True)
    # stepq_recount() as migration 0006 wrote it, with the tokens added by one more statement
    op.execute("ALTER FUNCTION stepq_recount() RENAME TO stepq_recount_counts")
    op.execute(
        "CREATE FUNCTION stepq_recount() RETURNS void LANGUAGE plpgsql AS $$ BEGIN "
        "PERFORM stepq_recount_counts(); "
        "INSERT INTO set_counters (problem_set_id, shard, tokens) "
        "SELECT p.problem_set_id, 0, coalesce(sum(r.tokens), 0) FROM rollouts r "
        "JOIN trajectories t ON t.id = r.trajectory_id JOIN problems p ON p.id = t.problem_id "
        "GROUP BY p.problem_set_id "
        "ON CONFLICT (problem_set_id, shard) DO UPDATE SET tokens = EXCLUDED.tokens; "
        "END $$"
    )
    op.execute("SELECT stepq_recount()")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION stepq_recount()")
        op.execute("ALTER FUNCTION stepq_recount_counts() RENAME TO stepq_recount")
        _replace_rollout_triggers(with_tokens=False)
    with op.batch_alter_table("set_counters") as batch_op:
        batch_op.drop_column("tokens")
