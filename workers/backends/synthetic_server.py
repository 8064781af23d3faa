"""An OpenAI-compatible completions server that serves the synthetic policy.

For demos and tests of the remote path without a GPU: ``stepq serve-synthetic`` runs it,
and the tests start it on loopback, with injected failures to exercise the retry paths.
It records every prompt it was asked to continue, so tests can check byte-exactness.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from stepq.workers.backends.synthetic_policy import SyntheticPolicy

MARKER = "Solution:\n"


@dataclass
class FailurePlan:
    """Fail the first ``first`` requests with ``status`` (``Retry-After: 0`` on 429), or,
    with ``status=0``, stall them for ``stall_s`` before answering (a client timeout)."""

    first: int = 0
    status: int = 503
    stall_s: float = 0.0
    seen: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def should_fail(self) -> bool:
        with self.lock:
            self.seen += 1
            return self.seen <= self.first


class SyntheticCompletionsServer:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        error_rate: float = 0.1,
        recovery_rate: float = 0.001,
        failures: FailurePlan | None = None,
        override: Callable[[str, int], str | None] | None = None,
    ) -> None:
        self.policy = SyntheticPolicy(error_rate=error_rate, recovery_rate=recovery_rate)
        self.failures = failures or FailurePlan()
        self.override = override
        """Tests: (prompt, seed) -> a reply to send instead of the policy's (None: the policy's)."""
        self.prompts: list[str] = []
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                server.requests += 1
                if self.path.rstrip("/") not in ("/v1/completions", "/completions"):
                    return self._reply(404, {"error": {"message": "only /v1/completions is served"}})
                if server.failures.should_fail():
                    if server.failures.status == 0:
                        time.sleep(server.failures.stall_s)
                        return None
                    return self._reply(
                        server.failures.status,
                        {"error": {"message": "injected failure"}},
                        {"Retry-After": "0"} if server.failures.status == 429 else None,
                    )
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    prompt, n, seed = body["prompt"], int(body.get("n", 1)), int(body.get("seed", 0))
                except (ValueError, KeyError, TypeError) as exc:
                    return self._reply(400, {"error": {"message": f"bad request: {exc}"}})
                server.prompts.append(prompt)
                head, _, prefix = prompt.rpartition(MARKER)
                texts = [server.reply(head + MARKER, prefix, seed + i) for i in range(n)]
                tokens = sum(len(t.split()) for t in texts)
                self._reply(
                    200,
                    {
                        "object": "text_completion",
                        "model": body.get("model", "synthetic"),
                        "choices": [{"index": i, "text": t, "finish_reason": "stop"} for i, t in enumerate(texts)],
                        "usage": {
                            "prompt_tokens": len(prompt.split()),
                            "completion_tokens": tokens,
                            "total_tokens": tokens + len(prompt.split()),
                        },
                    },
                )

            def _reply(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    def reply(self, prompt: str, prefix: str, seed: int) -> str:
        forced = self.override(prompt + prefix, seed) if self.override else None
        return forced if forced is not None else self.policy.continue_text(prompt, prefix, seed)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://{name}:{port}/v1"

    def start(self) -> SyntheticCompletionsServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
