"""prompt tokens: per rollout, the context it continued where the engine reports it; per set, counted

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
# ``set_counters.prompt_tokens`` sums them per set, kept by the same statement-level triggers
# as the other rollout counters (their functions are replaced here; the triggers stay), and
# ``stepq_recount()`` learns the column.  SQLite has no triggers: status sums the rollouts.
# Self-contained on purpose: a revision does not import another's helpers.

SHARD = "(pg_backend_pid() % 8)::smallint"


def _rollout_upsert(rows: str, sign: str, with_prompt: bool) -> str:
    prompt = f", {sign}coalesce(sum(r.prompt_tokens), 0) AS prompt_tokens" if with_prompt else ""
    columns = "rollouts, rollouts_done, tokens" + (", prompt_tokens" if with_prompt else "")
    added = ", ".join(f"{c} = set_counters.{c} + EXCLUDED.{c}" for c in columns.split(", "))
    return (
        f"INSERT INTO set_counters (problem_set_id, shard, {columns}) "
        f"SELECT problem_set_id, {SHARD}, {columns} FROM ("
        f"SELECT p.problem_set_id, {sign}count(*) AS rollouts, "
        f"{sign}sum(CASE WHEN w.state = 'done' THEN 1 ELSE 0 END) AS rollouts_done, "
        f"{sign}coalesce(sum(r.tokens), 0) AS tokens{prompt} "
        f"FROM {rows} r JOIN trajectories t ON t.id = r.trajectory_id JOIN problems p ON p.id = t.problem_id "
        "LEFT JOIN rollout_work w ON w.trajectory_id = r.trajectory_id GROUP BY p.problem_set_id) AS deltas "
        f"ON CONFLICT (problem_set_id, shard) DO UPDATE SET {added}"
    )


def _replace_rollout_triggers(with_prompt: bool) -> None:
    for event, rows, sign in (("insert", "new_rows", ""), ("delete", "old_rows", "-")):
        statement = _rollout_upsert(rows, sign, with_prompt)
        op.execute(
            f"CREATE OR REPLACE FUNCTION stepq_count_rollouts_{event}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN {statement}; RETURN NULL; END $$"
        )


def upgrade() -> None:
    op.add_column("rollouts", sa.Column("prompt_tokens", sa.Integer(), nullable=True))
    op.add_column("set_counters", sa.Column("prompt_tokens", sa.BigInteger(), server_default="0", nullable=False))
    if op.get_bind().dialect.name != "postgresql":
        return
    _replace_rollout_triggers(with_prompt=True)
    # stepq_recount() as migration 0014 left it, with the prompt tokens added by one more statement
    op.execute("ALTER FUNCTION stepq_recount() RENAME TO stepq_recount_tokens")
    op.execute(
        "CREATE FUNCTION stepq_recount() RETURNS void LANGUAGE plpgsql AS $$ BEGIN "
        "PERFORM stepq_recount_tokens(); "
        "INSERT INTO set_counters (problem_set_id, shard, prompt_tokens) "
        "SELECT p.problem_set_id, 0, coalesce(sum(r.prompt_tokens), 0) FROM rollouts r "
        "JOIN trajectories t ON t.id = r.trajectory_id JOIN problems p ON p.id = t.problem_id "
        "GROUP BY p.problem_set_id "
        "ON CONFLICT (problem_set_id, shard) DO UPDATE SET prompt_tokens = EXCLUDED.prompt_tokens; "
        "END $$"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION stepq_recount()")
        op.execute("ALTER FUNCTION stepq_recount_tokens() RENAME TO stepq_recount")
        _replace_rollout_triggers(with_prompt=False)
    with op.batch_alter_table("set_counters") as batch_op:
        batch_op.drop_column("prompt_tokens")
    # SQLite drops a column in place (3.35+); rebuilding the table would trip the views over it
    op.execute("ALTER TABLE rollouts DROP COLUMN prompt_tokens")
