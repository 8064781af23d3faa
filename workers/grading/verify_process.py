"""math-verify in a child process: a limit that holds on any thread, and a free GIL.

math-verify's own timeout is SIGALRM, which only a process's main thread can use: a
worker with ``--pool threads`` would have no limit, and one pathological answer
(``9^{9^{9^9}}``) would hold a worker slot for ever.  Even on a main thread, sympy's big
integer arithmetic holds the GIL, starving the worker's heartbeat until its leases expire.
Here the check runs in a child process (a fresh interpreter, so it never inherits an engine
or a CUDA context) that is killed and replaced when it overruns.  Each thread gets its own
child, so threads grade in parallel.
"""

from __future__ import annotations

import json
import logging
import select
import subprocess
import sys
import threading
from collections import OrderedDict
from typing import IO, Any

log = logging.getLogger("stepq.grading")


class GoldCache:
    """Parsed references, most recent kept: every rollout of a problem is graded against
    the same reference, so each is parsed once."""

    def __init__(self, size: int = 50000) -> None:
        self.size = size
        self._items: OrderedDict[str, Any] = OrderedDict()
        self.parses = 0

    def get(self, reference: str, timeout: int) -> Any:
        hit = self._items.get(reference)
        if hit is not None:
            self._items.move_to_end(reference)
            return hit
        from math_verify import parse

        self.parses += 1
        parsed = parse(f"${reference}$", parsing_timeout=timeout) or parse(reference, parsing_timeout=timeout)
        self._items[reference] = parsed
        if len(self._items) > self.size:
            self._items.popitem(last=False)
        return parsed


def check(gold_cache: GoldCache, reference: str, candidate: str, timeout: int) -> tuple[str, int, str | None]:
    """(method, reward, parsed answer) for one candidate; runs in the verify process."""
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    try:
        gold = gold_cache.get(reference, timeout)
        pred = parse(candidate, parsing_timeout=timeout, raise_on_error=False)
        if not pred or not gold:
            return ("no-answer", 0, None)
        # raise_on_error: a timeout must say so (recorded, re-gradable), not read as "wrong".
        ok = verify(gold, pred, timeout_seconds=timeout, raise_on_error=True)
        return ("verify", int(bool(ok)), str(pred[-1]))
    except TimeoutException:  # not an Exception subclass
        return ("timeout", 0, None)
    except Exception:
        return ("error", 0, None)


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:  # pragma: no cover - the child's loop
    """Answer one JSON line per request line until the parent closes the pipe."""
    cache = GoldCache()
    for line in requests:
        reference, candidate, timeout = json.loads(line)
        replies.write(json.dumps(check(cache, reference, candidate, int(timeout))).encode() + b"\n")
        replies.flush()


class VerifyProcess:
    """One child process answering verify requests, restarted after a timeout.

    A plain subprocess (``python -m stepq.workers.grading.verify_process``), not multiprocessing:
    Celery's prefork children are daemonic and may not start multiprocessing children.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.started = False
        """Whether the running child has answered once (its imports are done)."""

    def _start(self) -> subprocess.Popen[bytes]:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "stepq.workers.grading.verify_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            # its own process group: a Ctrl-C at the terminal stops the command, which then
            # closes this child; reaching the child too, it killed it mid-check, and the
            # answer it was grading was scored as a timeout (reward 0)
            process_group=0,
        )
        return self._proc

    def check(self, reference: str, candidate: str, timeout_s: float) -> tuple[str, int, str | None]:
        """(method, reward, parsed answer); method is "timeout" when the child overran."""
        proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps([reference, candidate, max(1, int(timeout_s))]).encode() + b"\n")
            proc.stdin.flush()
            # The child's own SIGALRM limit usually answers first; the kill is the backstop
            # (the first call also waits for the child's imports).
            ready, _, _ = select.select([proc.stdout], [], [], timeout_s + (2.0 if self.started else 30.0))
            if ready:
                line = proc.stdout.readline()
                if line:
                    self.started = True
                    method, reward, parsed = json.loads(line)
                    return str(method), int(reward), parsed
        except (BrokenPipeError, ValueError):
            pass
        log.warning("grading overran %.1fs (or its process died); restarting the verify process", timeout_s)
        self.close()
        self.restarts += 1
        return ("timeout", 0, None)

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=5)
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
        self._proc, self.started = None, False


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


if __name__ == "__main__":  # pragma: no cover - the child
    serve(sys.stdin.buffer, sys.stdout.buffer)
