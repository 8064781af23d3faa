"""The models and the migration head agree, and the operator views exist, on both dialects."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from stepq.migrations import alembic_config, current
from stepq.models import Base, Database


def test_autogenerate_finds_no_difference(any_db: Database) -> None:
    with any_db.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []


def test_database_is_at_head(any_db: Database) -> None:
    head = ScriptDirectory.from_config(alembic_config(any_db.url)).get_current_head()
    assert head is not None
    assert current(any_db.url) == head


def test_views_exist_and_answer(any_db: Database) -> None:
    views = set(inspect(any_db.engine).get_view_names())
    assert {"annotation_progress", "chunk_q_values", "work_queue"} <= views
    with any_db.engine.connect() as conn:
        for view in views:
            conn.execute(text(f"SELECT * FROM {view}")).all()


def test_constraint_names_follow_the_convention(any_db: Database) -> None:
    insp = inspect(any_db.engine)
    uniques = {u["name"] for u in insp.get_unique_constraints("rollouts")}
    assert "uq_rollouts_trajectory_id_prefix_len_sample_idx" in uniques
    fks = {f["name"] for f in insp.get_foreign_keys("rollouts")}
    assert "fk_rollouts_trajectory_id_trajectories" in fks


def test_upgrade_is_idempotent(any_db: Database) -> None:
    from stepq.migrations import upgrade

    upgrade(any_db.url)
    upgrade(any_db.url)
