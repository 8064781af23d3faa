"""Two commands changing one set's settings at once: the second waits for the first and says
what it replaced, so the last writer's M never wins silently."""

from __future__ import annotations

import threading
import time

from stepq.models import Database, queries
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.labelling.annotation_plans import PlanReport, configure_annotation


def test_annotate_reports_the_settings_it_replaced(any_db: Database) -> None:
    synth_set(any_db, "s", problems=2, seed=1)
    first = configure_annotation(any_db, "s", 8)
    assert first.overridden == {}, "a set never annotated has nothing to override"
    again = configure_annotation(any_db, "s", 8)
    assert again.overridden == {}
    changed = configure_annotation(any_db, "s", 16, rule="rel-ratio:gamma=0.7")
    assert changed.overridden["rollouts_per_prefix"] == (8, 16)
    assert changed.overridden["label_rule"][0] == "abs-q"


def test_a_second_annotate_waits_for_the_first_and_reports_its_values(pg: Database) -> None:
    synth_set(pg, "s", problems=2, seed=1)
    configure_annotation(pg, "s", 8)
    reports: list[PlanReport] = []
    with pg.session() as first:  # another command's transaction, holding the set while it changes M
        queries.get_set(first, "s", for_update=True).rollouts_per_prefix = 12
        first.flush()
        second = threading.Thread(target=lambda: reports.append(configure_annotation(pg, "s", 16)))
        second.start()
        time.sleep(1.0)
        assert not reports, "the second command waits for the first's transaction"
    second.join(30)
    (report,) = reports
    assert report.overridden == {"rollouts_per_prefix": (12, 16)}, "it saw, and says, the first one's M"
    with pg.session() as s:
        assert queries.get_set(s, "s").rollouts_per_prefix == 16
