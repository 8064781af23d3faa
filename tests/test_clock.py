"""stepq keeps the database's time: a host's wall clock that jumps after start moves no lease."""

from __future__ import annotations

import logging
import time

import pytest
from sqlalchemy import select

from stepq.models import Database, RolloutWork, jobs
from stepq.models.base import epoch
from stepq.models.work import ROLLOUT_WORK
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set


def test_a_wall_clock_step_after_start_moves_no_lease(
    any_db: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    synth_set(any_db, "c", problems=1, seed=1)
    configure_annotation(any_db, "c", 2)
    with any_db.session() as s:
        (work_id,) = s.scalars(select(RolloutWork.id)).all()
    before = epoch()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 310.0)  # the host's clock steps back
    with caplog.at_level(logging.WARNING, logger="stepq.clock"):
        assert abs(epoch() - before) < 5.0, "stepq's time did not step with the host's"
    assert "this host's clock jumped -310 s" in caplog.text
    with any_db.session() as s:
        assert jobs.claim(s, ROLLOUT_WORK, work_id, "w", ttl=60)
    with any_db.session() as s:
        expires = s.scalar(select(RolloutWork.lease_expires_at).where(RolloutWork.id == work_id))
    assert expires is not None and abs(expires - (real() + 60)) < 5.0, "a lease of 60 s from now, not 250 s ago"
