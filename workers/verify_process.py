"""math-verify in a child process, for threads that cannot bound it themselves.

math-verify's own timeout is SIGALRM, which only a process's main thread can use: a
worker with ``--pool threads`` (or any library that grades on a thread) would have no limit,
and one pathological answer (``9^{9^{9^9}}``) would hold a worker slot forever.  Here the
check runs in a child process (started by spawn, so it never inherits an engine or a CUDA
context) that is killed and replaced when it overruns.  Each thread gets its own child, so
threads grade in parallel.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger("stepq.grading")


def _serve(conn: Connection) -> None:  # pragma: no cover - runs in the child process
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    while True:
        try:
            reference, candidate, timeout = conn.recv()
        except EOFError:
            return
        try:
            gold = parse(f"${reference}$", parsing_timeout=timeout) or parse(reference, parsing_timeout=timeout)
            pred = parse(candidate, parsing_timeout=timeout, raise_on_error=False)
            if not pred or not gold:
                conn.send(("no-answer", 0, None))
                continue
            ok = verify(gold, pred, timeout_seconds=timeout, raise_on_error=True)
            conn.send(("verify", int(bool(ok)), str(pred[-1])))
        except TimeoutException:  # not an Exception subclass
            conn.send(("timeout", 0, None))
        except Exception:
            conn.send(("error", 0, None))


class VerifyProcess:
    """One child process answering verify requests, restarted after a timeout."""

    def __init__(self) -> None:
        self._proc: Any = None
        self._conn: Connection | None = None
        self.restarts = 0

    def _start(self) -> Connection:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="stepq-verify")
        self._proc.start()
        child.close()
        self._conn = parent
        return parent

    def check(self, reference: str, candidate: str, timeout_s: float) -> tuple[str, int, str | None]:
        """(method, reward, parsed answer); method is "timeout" when the child overran."""
        conn = self._conn or self._start()
        conn.send((reference, candidate, max(1, int(timeout_s))))
        # The child's own SIGALRM limit usually answers first; the kill is the backstop.
        if conn.poll(timeout_s + 2.0):
            try:
                return conn.recv()  # type: ignore[no-any-return]
            except EOFError:
                pass
        log.warning("grading overran %.1fs; restarting the verify process", timeout_s)
        self.close()
        self.restarts += 1
        return ("timeout", 0, None)

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn = None, None


class VerifyProcesses:
    """A child per thread that asks (created on first use, closed together)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[VerifyProcess] = []
        self._lock = threading.Lock()

    def get(self) -> VerifyProcess:
        proc = getattr(self._local, "proc", None)
        if proc is None:
            proc = self._local.proc = VerifyProcess()
            with self._lock:
                self._all.append(proc)
        return proc

    def close(self) -> None:
        with self._lock:
            for proc in self._all:
                proc.close()
            self._all.clear()
