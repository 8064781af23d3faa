"""The lease: which process may act on a row, until when.

Every kind of leased thing in stepq (queue jobs, training runs, named locks such as the
dispatcher's) carries the same two columns, ``lease_owner`` and ``lease_expires_at`` (epoch
seconds), and changes hands only through these conditional updates: the row count says
whether this process won, so two processes can never both believe they hold a lease.  A
holder that dies simply stops renewing, and the lease expires.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, or_, update
from sqlalchemy.orm import Session

from stepq.models.base import epoch


def takeable(model: Any, now: float, owner: str | None = None) -> Any:
    """Free, expired, or (with ``owner``) already ours: a re-entrant take renews it."""
    conditions = [model.lease_owner.is_(None), model.lease_expires_at < now]
    if owner is not None:
        conditions.append(model.lease_owner == owner)
    return or_(*conditions)


def take(
    session: Session, model: Any, where: Any, owner: str, ttl: float, *, reentrant: bool = False, **values: Any
) -> bool:
    """Take the lease on the row(s) ``where`` selects when nobody live holds it."""
    now = epoch()
    result = session.execute(
        update(model)
        .where(where, takeable(model, now, owner if reentrant else None))
        .values(lease_owner=owner, lease_expires_at=now + ttl, **values)
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def renew(session: Session, model: Any, where: Any, owner: str, ttl: float, **values: Any) -> int:
    """Extend ``owner``'s leases among the rows ``where`` selects; returns how many it still
    held (0: the lease was lost, someone else may act on the row now)."""
    result = session.execute(
        update(model)
        .where(and_(where, model.lease_owner == owner))
        .values(lease_expires_at=epoch() + ttl, **values)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def release(session: Session, model: Any, where: Any, owner: str, **values: Any) -> bool:
    """Give the lease up (with ``values`` written in the same update), only if still ours."""
    result = session.execute(
        update(model)
        .where(and_(where, model.lease_owner == owner))
        .values(lease_owner=None, lease_expires_at=None, **values)
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]
