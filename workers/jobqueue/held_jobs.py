"""The jobs a worker process holds now: exactly what its heartbeat renews, and what it still
owes the database (a release it could not write while the database was away)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from sqlalchemy.orm import Session

from stepq.models import jobs
from stepq.workers.jobqueue.job_kind import JobKind


class HeldJobs:
    """The jobs this process holds now, per kind.  The runner registers a message's jobs for as
    long as its handler runs (``holding``), and the write-behind thread for as long as it still
    has a job's batch to commit (``hold``/``release``); once nothing holds a job, nothing renews
    it and its lease runs out.  Counted, so the two can overlap."""

    def __init__(self) -> None:
        self._held: dict[JobKind, Counter[int]] = {}
        self._owed: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    @contextmanager
    def holding(self, kind: JobKind, ids: Sequence[int]) -> Iterator[None]:
        self.hold(kind, ids)
        try:
            yield
        finally:
            self.release(kind, ids)

    def hold(self, kind: JobKind, ids: Sequence[int]) -> None:
        with self._lock:
            self._held.setdefault(kind, Counter()).update(ids)

    def release(self, kind: JobKind, ids: Sequence[int]) -> None:
        with self._lock:
            held = self._held[kind]
            held.subtract(ids)
            for i in ids:
                if held.get(i, 0) <= 0:
                    held.pop(i, None)

    def now(self) -> dict[JobKind, list[int]]:
        with self._lock:
            return {kind: sorted(ids) for kind, ids in self._held.items() if ids}

    def __len__(self) -> int:
        with self._lock:
            return sum(len(ids) for ids in self._held.values())

    def owe(self, settle: Callable[[], None]) -> None:
        """A release that could not be written; ``settle_owed`` tries it again."""
        with self._lock:
            self._owed.append(settle)

    def settle_owed(self) -> int:
        """Write the owed releases that can be written now; returns how many were."""
        with self._lock:
            owed, self._owed = self._owed, []
        done = 0
        for settle in owed:
            try:
                settle()
                done += 1
            except Exception:
                with self._lock:
                    self._owed.append(settle)
        return done

    def renew(self, session: Session, owner: str, ttl: float) -> int:
        """Extend the leases on every job held now; returns how many this process still holds."""
        return sum(jobs.renew(session, kind.table, ids, owner, ttl) for kind, ids in self.now().items())
