"""PostgreSQL and Redis servers of the suite's own, so that no test ever restarts, flushes or
fills the machine's (or a developer's laptop's) services.

``PrivatePostgres`` runs ``initdb`` into a temporary directory and starts the cluster on a
free loopback port with trust authentication, from the PostgreSQL binaries installed on the
machine (``pg_config --bindir``, else ``/usr/lib/postgresql/*/bin``, else ``PATH``).  As root
(CI) the cluster runs as the ``postgres`` user, since PostgreSQL refuses root.  ``PrivateRedis``
is a ``redis-server`` on a free port with persistence off.  Both can be stopped and started
again on the same port (the fault tests' restarts) and are removed when the session ends.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


class ServiceError(RuntimeError):
    """A private server could not be set up; the message says what is missing."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(check: object, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise ServiceError(f"{what} did not answer within {timeout:.0f} s")


def _version(name: str) -> int:
    return int(name) if name.isdigit() else 0


def _pg_bindir() -> Path:
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        if out and (Path(out) / "initdb").exists():
            return Path(out)
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: _version(Path(p).parts[-3]))
    if versions:
        return Path(versions[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise ServiceError("the PostgreSQL server binaries (initdb, pg_ctl) are not installed: see docs/testing.md")


class PrivatePostgres:
    def __init__(self, also_listen_on: str | None = None) -> None:
        """``also_listen_on``: an address besides loopback (a test host's link, ``tests/hosts.py``)."""
        self.addresses = ",".join(a for a in ("127.0.0.1", also_listen_on) if a)
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="stepq-test-pg-"))
        self.data = self.root / "data"
        self.bindir: Path | None = None
        self.started = False

    @property
    def url(self) -> str:
        """The server's admin URL (the tests' ``PG_SERVER``)."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_owner(self, args: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return args
        return ["runuser", "-u", "postgres", "--", *args]

    def _run(self, *args: str) -> None:
        assert self.bindir is not None
        cmd = self._as_owner([str(self.bindir / args[0]), *args[1:]])
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
        if done.returncode != 0:
            raise ServiceError(f"{args[0]} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> None:
        if self.bindir is None:
            self.bindir = _pg_bindir()
            if os.geteuid() == 0:
                try:
                    owner = pwd.getpwnam("postgres")
                except KeyError:
                    raise ServiceError("running as root needs a 'postgres' user to own the test cluster") from None
                os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
            if "," in self.addresses:  # the other end of a listened-on link may connect too
                with (self.data / "pg_hba.conf").open("a") as hba:
                    hba.write("host all all samenet trust\n")
        options = (
            f"-c listen_addresses={self.addresses} -p {self.port} -k {self.root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-o", options, "-w", "start")
        self.started = True

    def stop(self, mode: str = "fast") -> None:
        if self.started:
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")
            self.started = False

    def restart(self) -> None:
        """Stop and start on the same port: every connection is cut, as a real restart cuts them."""
        self.stop()
        self.start()

    def remove(self) -> None:
        with contextlib.suppress(ServiceError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis:
    """A Redis server of the caller's own, on a free port, that it may stop and start."""

    def __init__(self, workdir: Path | None = None, also_listen_on: str | None = None) -> None:
        self.addresses = [a for a in ("127.0.0.1", also_listen_on) if a]
        self.port = free_port()
        self.owns_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="stepq-test-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        if shutil.which("redis-server") is None:
            raise ServiceError("redis-server is not installed: see docs/testing.md")
        args = ["redis-server", "--port", str(self.port), "--bind", *self.addresses, "--save", "", "--appendonly", "no"]
        if len(self.addresses) > 1:  # bound to loopback and a test host's link, nothing else
            args += ["--protected-mode", "no"]
        self.proc = subprocess.Popen(args, cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        try:
            _wait(lambda: _pings(client), "the private Redis")
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def remove(self) -> None:
        self.stop()
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
