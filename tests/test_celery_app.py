"""The Celery app's contract: JSON only, late acks, prefetch 1, and messages that route
through the default exchange straight onto the Redis list the workers read."""

from __future__ import annotations

import base64
import json
import uuid

import pytest
import redis

from stepq.settings import Settings
from stepq.workers.celery_app import TASK_NAME, create_app, publisher, run_worker
from stepq.workers.celery_options import CeleryOptions
from stepq.workers.jobqueue.broker_contents import redis_queue_depth
from stepq.workers.kinds import SEARCHES
from tests.helpers import REDIS_URL


def test_configuration_for_long_gpu_tasks() -> None:
    app = create_app(CeleryOptions("redis://127.0.0.1:6379/0", "q", 7200))
    conf = app.conf
    assert conf.accept_content == ["json"] and conf.task_serializer == "json"
    assert conf.task_acks_late is True and conf.worker_prefetch_multiplier == 1
    assert conf.broker_transport_options["visibility_timeout"] == 7200
    assert TASK_NAME in app.tasks and SEARCHES.task_name in app.tasks, "one task per kind of queue work"
    settings = Settings.from_env({"STEPQ_DATABASE_URL": "sqlite:///x.db"})
    assert settings.celery_options().visibility_timeout_s > settings.lease_ttl_s


def test_published_messages_are_json_on_the_queue_list(redis_client: redis.Redis) -> None:
    queue = f"stepq.test.{uuid.uuid4().hex[:6]}"
    app = create_app(CeleryOptions(REDIS_URL, queue))
    publisher(app, per_message=2)([11, 12, 13])
    depth = redis_queue_depth(REDIS_URL, queue)
    assert depth() == 2
    raw = [json.loads(m) for m in redis_client.lrange(queue, 0, -1)]
    assert {m["content-type"] for m in raw} == {"application/json"}
    bodies = [json.loads(base64.b64decode(m["body"])) for m in raw]
    assert sorted(b[0][0] for b in bodies) == [[11, 12], [13]], "ids travel in groups, as JSON"
    assert all(m["headers"]["task"] == TASK_NAME for m in raw)
    redis_client.flushdb()  # a broker that lost everything, bindings included
    publisher(app)([14])
    assert depth() == 1, "still routed without Celery's exchange bindings"


def test_the_broker_says_which_jobs_its_messages_carry(redis_client: redis.Redis) -> None:
    """Waiting messages and delivered-but-unacknowledged ones (a worker holds them under
    acks_late) both carry their jobs; a message that vanished carries nothing."""
    from kombu import Connection

    from stepq.workers.jobqueue.broker_contents import RESERVED_FOR_S, redis_jobs_in_broker
    from stepq.workers.kinds import ROLLOUTS

    queue = f"stepq.test.{uuid.uuid4().hex[:6]}"
    app = create_app(CeleryOptions(REDIS_URL, queue))
    publisher(app, ROLLOUTS, per_message=2)([11, 12, 13])
    publisher(app, SEARCHES)([5])
    contents = redis_jobs_in_broker(REDIS_URL, queue)
    assert contents() == {TASK_NAME: {11, 12, 13}, SEARCHES.task_name: {5}}
    with Connection(REDIS_URL) as conn:  # a worker takes one message and has not acked it
        taken = conn.default_channel.basic_get(queue, no_ack=False)
        assert taken is not None
        assert redis_client.llen(queue) == 2
        assert contents() == {TASK_NAME: {11, 12, 13}, SEARCHES.task_name: {5}}, "reserved still counts"
        raw = redis_client.lrange(queue, 0, 0)[0]
        redis_client.lrem(queue, 1, raw)  # a message lost from the broker
        removed = json.loads(raw)
        task = removed["headers"]["task"]
        ids = set(json.loads(base64.b64decode(removed["body"]))[0][0])
        got = contents()
        assert got is not None and not (ids & got.get(task, set())), "a lost message's jobs are carried by none"
        assert sum(len(v) for v in got.values()) == 4 - len(ids), "the others are all still there"
        # The worker that took the message died before claiming its jobs: once its delivery is
        # older than RESERVED_FOR_S, the message no longer counts (its jobs get published again).
        tag, delivered_at = redis_client.zrange("unacked_index", 0, -1, withscores=True)[0]
        taken_ids = set(json.loads(base64.b64decode(json.loads(redis_client.hget("unacked", tag))[0]["body"]))[0][0])
        redis_client.zadd("unacked_index", {tag: delivered_at - RESERVED_FOR_S - 1})
        stale = contents()
        assert stale is not None and not (taken_ids & set().union(*stale.values())), "a dead worker's reservation"
        assert sum(len(v) for v in stale.values()) == 4 - len(ids) - len(taken_ids)
    redis_client.flushdb()
    assert contents() == {}


def test_a_worker_loop_that_ends_unasked_exits_with_the_brokers_status() -> None:
    """Celery exits 0 whatever ended its loop: a broker that refused the writes of a worker's
    fetch (Redis out of memory: `OutOfMemoryError` on the transport's ZADD, reproduced by hand)
    ended every worker with status 0, which a restart-on-failure supervisor reads as done."""
    from celery import signals

    from stepq.models.errors import BrokerError

    class Loop:
        def __init__(self, asked: bool, code: int | None) -> None:
            self.asked, self.code = asked, code

        def worker_main(self, argv: list[str]) -> None:
            if self.asked:  # what Celery sends when SIGTERM or SIGINT asks it to stop
                signals.worker_shutting_down.send(sender="test", sig="SIGTERM", how="Warm", exitcode=0)
            raise SystemExit(self.code)

    with pytest.raises(BrokerError, match="stopped without being asked to"):
        run_worker(Loop(asked=False, code=0), [])
    with pytest.raises(SystemExit) as stopped:
        run_worker(Loop(asked=True, code=0), [])
    assert stopped.value.code == 0, "asked to stop: as Celery says"
    with pytest.raises(SystemExit) as failed:
        run_worker(Loop(asked=False, code=70), [])
    assert failed.value.code == 70, "a non-zero status is kept"


def test_a_full_redis_is_a_lost_connection_to_the_transport() -> None:
    """Celery's consumer recovers from connection errors only: kombu files Redis's refusal at
    ``maxmemory`` under channel errors, and every worker ended on it."""
    from kombu import Connection
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import OutOfMemoryError

    from stepq.workers.full_broker import BrokerFull, FullBrokerTransport, transport_for

    assert transport_for("redis://:pw@host:6379/0") == "stepq-redis"
    assert transport_for("rediss://host:6380/0") is None, "TLS takes its settings from kombu's own name"
    assert transport_for("sentinel://host:26379") is None
    assert issubclass(BrokerFull, OutOfMemoryError)
    assert issubclass(OutOfMemoryError, FullBrokerTransport.connection_errors)
    assert issubclass(RedisConnectionError, FullBrokerTransport.connection_errors), "kombu's own kept"
    app = create_app(CeleryOptions(broker_url="redis://127.0.0.1:1/0"))
    with app.connection_for_read() as conn:
        assert isinstance(conn, Connection) and conn.get_transport_cls() is FullBrokerTransport
