"""The models and the migration head agree, and the operator views exist, on both dialects."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, make_url, text

from stepq.migrations import alembic_config, current
from stepq.models import Base, Database
from stepq.workers.labelling.budget import Adaptive
from tests.helpers import PG_SERVER


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


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of its own that a test may migrate up and down."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'migrate.db'}"
        return
    admin = create_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
    name = f"stepq_migrate_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(PG_SERVER).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_budget_column_widens_under_the_views_and_back(empty_url: str) -> None:
    """0009 makes room for pinned budget specs: the views that read problem_sets survive on
    both dialects, stored specs are kept, and a downgrade turns the long ones into
    ``adaptive`` rather than failing."""
    from stepq.migrations import upgrade

    upgrade(empty_url, "20261123_0008")
    engine = create_engine(empty_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO problem_sets (name, budget_policy, backend_config, sampling) "
                    "VALUES (:n, :b, '{}', '{}')"
                ),
                [{"n": "old", "b": "adaptive:min=4"}, {"n": "plain", "b": "exhaustive"}],
            )
        upgrade(empty_url)
        pinned = Adaptive(min_samples=4).pinned
        assert len(pinned) > 40
        with engine.begin() as conn:
            conn.execute(text("UPDATE problem_sets SET budget_policy = :b WHERE name = 'old'"), {"b": pinned})
            progress = dict(conn.execute(text("SELECT problem_set, budget_policy FROM annotation_progress")).all())
            assert progress == {"old": pinned, "plain": "exhaustive"}
            views = set(inspect(conn).get_view_names())
        command.downgrade(alembic_config(empty_url), "20261123_0008")
        with engine.connect() as conn:
            assert set(inspect(conn).get_view_names()) == views
            progress = dict(conn.execute(text("SELECT problem_set, budget_policy FROM annotation_progress")).all())
        assert progress == {"old": "adaptive", "plain": "exhaustive"}
        upgrade(empty_url)
        assert current(empty_url) == ScriptDirectory.from_config(alembic_config(empty_url)).get_current_head()
    finally:
        engine.dispose()


def test_convincing_wrong_keeps_its_mirror_across_0021(empty_url: str) -> None:
    """0021 spells the old ``convincing-wrong`` (which had its mirror) with ``mirror=yes`` on
    sets and round records, so no set's order changes; a downgrade takes the option off and
    refuses a set the old spelling cannot express."""
    from stepq.migrations import upgrade
    from stepq.workers.priority.strategies import parse_strategy

    upgrade(empty_url, "20261128_0020")
    engine = create_engine(empty_url)
    rows = {"cw": "convincing-wrong:run=3", "cwl": "convincing-wrong:lineage=judge,votes=8", "u": "uncertainty:run=3"}
    try:
        with engine.begin() as conn:
            for name, strategy in rows.items():
                conn.execute(
                    text(
                        "INSERT INTO problem_sets (name, budget_policy, backend_config, sampling, priority_strategy) "
                        "VALUES (:n, 'exhaustive', '{}', '{}', :s)"
                    ),
                    {"n": name, "s": strategy},
                )
            conn.execute(
                text(
                    "INSERT INTO priority_rounds (problem_set_id, strategy, created_at, rollouts_before, "
                    "labelled_before, covered_to_id, details) SELECT id, priority_strategy, 0, 0, 0, 0, '{}' "
                    "FROM problem_sets"
                )
            )
        upgrade(empty_url)
        with engine.connect() as conn:
            sets = dict(conn.execute(text("SELECT name, priority_strategy FROM problem_sets")).all())
            rounds = {s for (s,) in conn.execute(text("SELECT strategy FROM priority_rounds"))}
        assert sets == {
            "cw": "convincing-wrong:run=3,mirror=yes",
            "cwl": "convincing-wrong:lineage=judge,votes=8,mirror=yes",
            "u": "uncertainty:run=3",
        }
        assert rounds == set(sets.values())
        assert all(parse_strategy(s).key == s for s in sets.values()), "the migrated spelling is canonical"
        assert parse_strategy(sets["cw"]).mirror and not parse_strategy("convincing-wrong:run=3").mirror

        with engine.begin() as conn:
            conn.execute(text("UPDATE problem_sets SET priority_strategy = 'convincing-wrong:run=4' WHERE name = 'u'"))
        with pytest.raises(RuntimeError, match="without its mirror"):
            command.downgrade(alembic_config(empty_url), "20261128_0020")
        with engine.begin() as conn:
            conn.execute(text("UPDATE problem_sets SET priority_strategy = 'fifo' WHERE name = 'u'"))
        command.downgrade(alembic_config(empty_url), "20261128_0020")
        with engine.connect() as conn:
            sets = dict(conn.execute(text("SELECT name, priority_strategy FROM problem_sets")).all())
        assert sets == {"cw": rows["cw"], "cwl": rows["cwl"], "u": "fifo"}
    finally:
        engine.dispose()
