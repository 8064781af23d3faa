"""What the broker holds, read directly from Redis: how many messages wait, and which jobs have a
message at all (waiting in the queue, or delivered to a worker and not yet acknowledged).

The dispatcher uses the second to find lost messages exactly while the queue still holds
other work: a job marked queued in the database whose id is in no message is lost, whatever
the queue's depth.  The broker stays bounded (a few messages per live worker), so reading
all of it each cycle is cheap.  Celery's Redis transport keeps waiting messages on a list
named after the queue and delivered-unacknowledged ones (``acks_late``: until the task ends)
in the ``unacked`` hash, with their delivery times in ``unacked_index`` (a message a dead
worker took stops counting after ``RESERVED_FOR_S``); a message is JSON whose base64 body is ``[args, kwargs, embed]``,
and a stepq task's first argument is its list of job ids.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("stepq.dispatcher")

UNACKED_KEY = "unacked"
"""kombu's Redis transport: delivery tag -> [message, exchange, routing key] until acked."""
UNACKED_INDEX_KEY = "unacked_index"
"""kombu's Redis transport: delivery tag -> when it was delivered (epoch s), a sorted set."""
RESERVED_FOR_S = 30.0
"""How long a delivered, unacknowledged message counts as carrying its jobs.  A worker
(prefetch 1, acks_late) holds one message at a time and claims its jobs as soon as it starts
it; jobs of a message delivered this long ago that are still queued were never claimed: its
worker died first (SIGKILL mid-claim), and the message would only come back after the
visibility timeout (an hour by default)."""

JobsInBroker = dict[str, set[int]]
"""Task name -> ids of the jobs some message of that task carries."""


def _is_redis(broker_url: str) -> bool:
    return broker_url.startswith(("redis://", "rediss://"))


def redis_queue_depth(broker_url: str, queue: str) -> Callable[[], int | None]:
    """How many messages wait in the queue, or None when it cannot be told."""
    if not _is_redis(broker_url):
        return lambda: None
    import redis

    client = redis.Redis.from_url(broker_url, socket_timeout=5)

    def depth() -> int | None:
        try:
            return int(client.llen(queue))  # type: ignore[arg-type]
        except redis.RedisError:
            return None

    return depth


def redis_jobs_in_broker(
    broker_url: str, queue: str, reserved_for_s: float = RESERVED_FOR_S
) -> Callable[[], JobsInBroker | None]:
    """Which jobs have a message in the broker now, per task, or None when it cannot be told
    (not Redis, unreachable, or a message stepq cannot read: then nothing is presumed lost).
    A delivered, unacknowledged message counts for ``reserved_for_s`` after its delivery."""
    if not _is_redis(broker_url):
        return lambda: None
    import redis

    client = redis.Redis.from_url(broker_url, socket_timeout=5)

    def read() -> JobsInBroker | None:
        try:
            waiting = client.lrange(queue, 0, -1)
            delivered = client.hgetall(UNACKED_KEY)
            since = dict(client.zrange(UNACKED_INDEX_KEY, 0, -1, withscores=True))  # type: ignore[arg-type]
        except redis.RedisError:
            return None
        now = time.time()
        reserved = [raw for tag, raw in delivered.items() if now - since.get(tag, now) < reserved_for_s]  # type: ignore[union-attr]
        try:
            messages = [json.loads(raw) for raw in waiting]  # type: ignore[union-attr]
            messages += [json.loads(raw)[0] for raw in reserved]
            return jobs_in(messages)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            log.warning("cannot read the broker's messages (%s); lost messages wait for an empty queue", exc)
            return None

    return read


def jobs_in(messages: Iterable[dict[str, Any]]) -> JobsInBroker:
    """Task name -> job ids, from Celery messages (protocol 2, JSON body)."""
    out: JobsInBroker = {}
    for message in messages:
        task = message.get("headers", {}).get("task")
        if not task:
            continue
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        ids = args[0] if args else []
        out.setdefault(task, set()).update(int(i) for i in ([ids] if isinstance(ids, int) else ids))
    return out
