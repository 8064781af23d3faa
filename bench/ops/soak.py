"""Soak: a fleet under chaos for ten minutes; nothing may be lost, duplicated or stuck.

    python -m bench.ops.soak [--trajectories 2000] [--chaos-s 600] [--workers 3] [--kill-every-s 4]

A synthetic set (``--trajectories`` problems, one trajectory each, M = 8) is annotated by real
``stepq dispatch`` and ``stepq worker`` processes on a scratch PostgreSQL database and a Redis
server of the soak's own.  For ``--chaos-s`` seconds a random worker is SIGKILLed every
``--kill-every-s`` seconds and a new one started; a third of the way in Redis is killed and
started again empty (no persistence), two thirds in PostgreSQL is restarted
(``pg_ctlcluster``; skipped, and said, where the server is not a local cluster).  Rollouts
are slowed (``--latency-s``) so the work outlasts the chaos.  Then the fleet finishes in
peace and the soak checks, from the database:

- lost: prefixes missing any of their M samples, or Q-values / labels that disagree with the
  rollout rows;
- duplicated: rollouts generated and written twice (the workers' own count of what they wrote
  against the rows stored; the unique key keeps rows single, so this counts wasted work);
- stuck: work items not done, or still running, once the fleet is idle;

and prints them with the largest broker queue depth seen (sampled every 0.5 s).  Not CI: it
runs for more than ten minutes.  The last line is JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import text

from bench.common import emit, scratch_pg
from stepq.models import Database

M = 8


class Redis:
    """A Redis server of the soak's own (so killing it disturbs nothing else)."""

    def __init__(self, workdir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.workdir, self.proc = workdir, None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(args, cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        for _ in range(100):
            try:
                if client.ping():
                    return
            except redis.RedisError:
                time.sleep(0.1)
        raise RuntimeError("the soak's Redis did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)


def pg_restart_command() -> list[str] | None:
    versions = sorted(p.name for p in Path("/etc/postgresql").iterdir()) if Path("/etc/postgresql").is_dir() else []
    if not versions or not shutil.which("pg_ctlcluster"):
        return None
    return ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main", "restart"]


class Fleet:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.workers: list[subprocess.Popen[bytes]] = []
        self.others: list[subprocess.Popen[bytes]] = []
        self.started = 0

    def stepq(self, *args: str) -> None:
        subprocess.run([sys.executable, "-m", "stepq", *args], env=self.env, check=True, capture_output=True)

    def spawn(self, *args: str, name: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        return subprocess.Popen([sys.executable, "-m", "stepq", *args], env=self.env, stdout=log, stderr=log)

    def start_worker(self) -> None:
        self.started += 1
        self.workers.append(self.spawn("worker", "--name", f"w{self.started}", name=f"w{self.started}"))

    def kill_one(self, rng: random.Random) -> None:
        alive = [w for w in self.workers if w.poll() is None]
        if alive:
            victim = rng.choice(alive)
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=30)
            self.workers.remove(victim)

    def stop(self) -> None:
        for proc in self.workers + self.others:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)


def census(db: Database) -> dict[str, int]:
    """What the database holds now: lost, duplicated and stuck, as defined above."""
    with db.engine.connect() as conn:
        missing = conn.execute(
            text(
                "SELECT coalesce(sum(:m - coalesce(r.n, 0)), 0) FROM trajectories t "
                "CROSS JOIN LATERAL generate_series(0, t.n_chunks - 1) AS k "
                "LEFT JOIN (SELECT trajectory_id, prefix_len, count(*) AS n FROM rollouts "
                "GROUP BY trajectory_id, prefix_len) r ON r.trajectory_id = t.id AND r.prefix_len = k"
            ),
            {"m": M},
        ).scalar_one()
        wrong_q = conn.execute(
            text(
                "SELECT count(*) FROM q_values q JOIN (SELECT trajectory_id, prefix_len, count(*) AS n, "
                "sum(reward) AS c FROM rollouts GROUP BY trajectory_id, prefix_len) r "
                "ON r.trajectory_id = q.trajectory_id AND r.prefix_len = q.prefix_len "
                "WHERE q.source = 'rollouts' AND (q.n_samples <> r.n OR abs(q.q - r.c::float / r.n) > 1e-9)"
            )
        ).scalar_one()
        written = conn.execute(text("SELECT coalesce(sum(rollouts_done), 0) FROM workers")).scalar_one()
        stored = conn.execute(text("SELECT count(*) FROM rollouts")).scalar_one()
        not_done = conn.execute(text("SELECT count(*) FROM rollout_work WHERE state <> 'done'")).scalar_one()
        running = conn.execute(text("SELECT count(*) FROM rollout_work WHERE state = 'running'")).scalar_one()
    return {
        "lost_samples": int(missing),
        "q_values_disagreeing": int(wrong_q),
        "duplicated_rollouts": int(written) - int(stored),
        "stuck_items": int(not_done),
        "running_items": int(running),
        "rollouts": int(stored),
    }


def soak(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="stepq-soak-"))
    broker = Redis(workdir)
    broker.start()
    restart_pg = pg_restart_command()
    with scratch_pg() as url:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")},
            "STEPQ_DATABASE_URL": url,
            "STEPQ_BROKER_URL": broker.url,
            "STEPQ_LEASE_TTL_S": "6",
            "STEPQ_LOST_GRACE_S": "3",
            "STEPQ_DISPATCH_INTERVAL_S": "0.5",
            "STEPQ_BATCH_ROLLOUTS": "32",
            "PYTHONUNBUFFERED": "1",
        }
        fleet = Fleet(env, workdir)
        fleet.stepq("synth", "--set", "soak", "--problems", str(args.trajectories), "--seed", str(args.seed),
                    "--latency-s", str(args.latency_s))  # fmt: skip
        fleet.stepq("annotate", "--set", "soak", "--rollouts", str(M))
        db = Database(url)
        deepest = [0]
        sampling = threading.Event()

        def sample_depth() -> None:
            client = redis.Redis.from_url(broker.url, socket_timeout=2)
            while not sampling.wait(0.5):
                with contextlib.suppress(redis.RedisError):  # the broker is being restarted
                    deepest[0] = max(deepest[0], int(client.llen("stepq.rollouts")))  # type: ignore[arg-type]

        threading.Thread(target=sample_depth, daemon=True).start()
        dispatcher = fleet.spawn("dispatch", name="dispatcher")
        fleet.others.append(dispatcher)
        for _ in range(args.workers):
            fleet.start_worker()
        events: list[str] = []
        started = time.monotonic()
        kills = 0
        try:
            redis_done = pg_done = False
            while (elapsed := time.monotonic() - started) < args.chaos_s:
                time.sleep(args.kill_every_s)
                fleet.kill_one(rng)
                kills += 1
                fleet.start_worker()
                if not redis_done and elapsed > args.chaos_s / 3:
                    broker.kill()
                    time.sleep(5)
                    broker.start()
                    redis_done = True
                    events.append(f"redis killed and restarted empty at {elapsed:.0f} s")
                if not pg_done and elapsed > 2 * args.chaos_s / 3:
                    pg_done = True
                    if restart_pg is None:
                        events.append("PostgreSQL restart skipped: not a local pg_ctlcluster cluster")
                    else:
                        subprocess.run(restart_pg, check=True, timeout=120)
                        db.engine.dispose()
                        events.append(f"PostgreSQL restarted at {elapsed:.0f} s")
            chaos_end = census(db)
            deadline = time.monotonic() + args.settle_s
            while time.monotonic() < deadline and census(db)["stuck_items"]:
                time.sleep(2)
            final = census(db)
            dispatcher_alive = dispatcher.poll() is None
        finally:
            sampling.set()
            fleet.stop()
            broker.kill()
            db.dispose()
    return {
        "trajectories": args.trajectories,
        "m": M,
        "chaos_s": args.chaos_s,
        "worker_kills": kills,
        "events": events,
        "dispatcher_survived": dispatcher_alive,
        "at_chaos_end": chaos_end,
        "largest_queue_depth": deepest[0],
        **final,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trajectories", type=int, default=2000)
    ap.add_argument("--chaos-s", type=float, default=600.0)
    ap.add_argument("--settle-s", type=float, default=600.0, help="How long the fleet may take to finish after.")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--kill-every-s", type=float, default=4.0)
    ap.add_argument("--latency-s", type=float, default=0.02, help="Simulated generation time per rollout.")
    ap.add_argument("--seed", type=int, default=0)
    result = soak(ap.parse_args())
    for key in ("lost_samples", "q_values_disagreeing", "duplicated_rollouts", "stuck_items", "running_items"):
        print(f"{key:<22} {result[key]}")
    print(f"{'largest_queue_depth':<22} {result['largest_queue_depth']}")
    emit(result)


if __name__ == "__main__":
    main()
