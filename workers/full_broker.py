"""A Redis broker that is full is ridden out as one that is down.

Redis at ``maxmemory`` (no eviction) refuses writes but still answers: kombu's Redis transport
files the refusal (``OutOfMemoryError``) under channel errors, which Celery's consumer does not
recover from, so a fetch or an acknowledgement made while the broker was full ended every
worker (measured: three workers dead within 30 s, the set stuck at 76/200).  Here the refusal
is a connection error, so the consumer reconnects as after an outage; and a connection counts
as made only once the broker takes a write, so the reconnection backs off (Celery's retry
intervals, each try logged) until there is room, instead of fetching messages it cannot file.

A message fetched just before a refused write is lost from the broker: its jobs stay queued
in the database, and the dispatcher publishes them again once it no longer sees them in the
broker (``broker_contents``).  An acknowledgement the broker refuses is settled here alone (the
task's result is already in the database): left unsettled it would hold the worker's one
prefetch slot for ever (measured: both workers idle, the set stuck).  The broker's record of
that delivery is redelivered after the visibility timeout, to a task that finds its jobs done.
Nothing is lost or done twice.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

import kombu.transport as kombu_transports
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from redis.exceptions import OutOfMemoryError

PROBE_KEY = "stepq:broker-takes-writes"
"""A key written (and left to expire) each time a worker connects: a full broker refuses it."""


class BrokerFull(OutOfMemoryError):
    """The broker refuses writes: it has reached its memory limit."""


_log = logging.getLogger("stepq.worker")


class _SettlingQoS(kombu_redis.QoS):  # type: ignore[misc]
    def ack(self, delivery_tag: str) -> None:
        try:
            super().ack(delivery_tag)
        except OutOfMemoryError:
            self._settle_here(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        try:
            super().reject(delivery_tag, requeue=requeue)
        except OutOfMemoryError:
            self._settle_here(delivery_tag)

    def _settle_here(self, delivery_tag: str) -> None:
        virtual.QoS.ack(self, delivery_tag)  # frees the prefetch slot
        _log.warning(
            "the broker is full and refused to settle message %s; settled here (its jobs are settled in the "
            "database), the broker redelivers it after its visibility timeout to no effect",
            delivery_tag,
        )


class _WritableChannel(kombu_redis.Channel):  # type: ignore[misc]
    QoS = _SettlingQoS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        try:
            self.client.set(PROBE_KEY, b"1", ex=60)
        except OutOfMemoryError as exc:
            self.close()
            raise BrokerFull(
                f"the broker is full and refuses writes ({exc}); waiting for room "
                "(raise Redis's maxmemory, or free it: nothing here is lost meanwhile)"
            ) from None


class FullBrokerTransport(kombu_redis.Transport):  # type: ignore[misc]
    """kombu's Redis transport, with a refused write counted as a lost connection."""

    Channel = _WritableChannel
    connection_errors = (*kombu_redis.Transport.connection_errors, OutOfMemoryError)


TRANSPORT = "stepq-redis"
"""Its name in kombu's table (what Celery's log shows: ``Connected to stepq-redis://...``)."""
kombu_transports.TRANSPORT_ALIASES.setdefault(TRANSPORT, f"{__name__}:FullBrokerTransport")


def transport_for(broker_url: str) -> str | None:
    """This transport for a plain ``redis://`` broker; None (kombu's own) for any other scheme:
    ``rediss://`` takes its TLS settings from its transport name, and Sentinel has its own."""
    return TRANSPORT if urlsplit(broker_url).scheme == "redis" else None
