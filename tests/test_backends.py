"""Generation backends: request building and result parsing, the OpenAI-compatible client
against a real loopback server (retries included), vLLM against a stand-in engine, and
transformers on a tiny model built here.  Plus exact continuation for every backend."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stepq.assembly import worker_runtime
from stepq.models import Database, queries
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.backends import GenerationBackend, GenerationRequest, SamplingParams, make_backend
from stepq.workers.backends.hf import HFBackend, cut_at_stop
from stepq.workers.backends.openai_server import OpenAICompletionsBackend, ServerError, build_calls, parse_response
from stepq.workers.backends.synthetic_policy import PROMPT_TEMPLATE, SyntheticPolicy, make_problem
from stepq.workers.backends.synthetic_server import FailurePlan, SyntheticCompletionsServer
from stepq.workers.backends.vllm_engine import build_engine_calls, read_engine_outputs
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.in_process import run_in_process
from stepq.workers.jobqueue.runtime import WorkerOptions

CTX = PROMPT_TEMPLATE.format(question=make_problem(1).question)


@pytest.fixture
def server() -> Iterator[SyntheticCompletionsServer]:
    srv = SyntheticCompletionsServer().start()
    yield srv
    srv.stop()


# --- OpenAI-compatible completions ----------------------------------------------------


def test_build_calls_per_sample_and_n() -> None:
    reqs = [GenerationRequest("a", (1, 2)), GenerationRequest("b", (3,))]
    params = SamplingParams(temperature=0.7, max_tokens=9, stop=("\n\n",))
    calls = build_calls(reqs, params, "m", per_sample_seeds=True)
    assert [(c.request_index, c.body["seed"], c.body["n"], c.body["prompt"]) for c in calls] == [
        (0, 1, 1, "a"),
        (0, 2, 1, "a"),
        (1, 3, 1, "b"),
    ]
    assert calls[0].body["stop"] == ["\n\n"] and calls[0].body["temperature"] == 0.7
    grouped = build_calls(reqs, params, "m", per_sample_seeds=False)
    assert [(c.body["n"], c.body["seed"]) for c in grouped] == [(2, 1), (1, 3)]


def test_parse_response() -> None:
    payload = {
        "choices": [{"index": 1, "text": "b"}, {"index": 0, "text": "a", "finish_reason": "length"}],
        "usage": {"completion_tokens": 10, "prompt_tokens": 7},
    }
    assert [(c.text, c.tokens, c.finish_reason, c.prompt_tokens) for c in parse_response(payload, 2)] == [
        ("a", 5, "length", 7),
        ("b", 5, "stop", 7),
    ], "one prompt per request: every choice continued all 7 of its tokens"
    assert parse_response({"choices": [{"text": "a"}]}, 1)[0].prompt_tokens is None, "not reported: unknown"
    with pytest.raises(ServerError):
        parse_response({"choices": []}, 1)


def test_openai_backend_against_the_loopback_server(server: SyntheticCompletionsServer) -> None:
    backend = OpenAICompletionsBackend(server.url, "synthetic", concurrency=4)
    reqs = [GenerationRequest(CTX, (1, 2, 3)), GenerationRequest(CTX, (1,))]
    out = backend.generate(reqs, SamplingParams())
    assert [len(o) for o in out] == [3, 1]
    assert out[0][0].text == out[1][0].text, "same seed, same sample"
    policy = SyntheticPolicy()
    assert out[0][1].text == policy.continue_text(CTX, "", 2)
    assert backend.usage["completion_tokens"] == sum(c.tokens for o in out for c in o) > 0
    assert all(c.prompt_tokens == len(CTX.split()) for o in out for c in o), "the server's usage, per prompt"
    assert server.prompts == [CTX] * 4


@pytest.mark.parametrize("status", [503, 429, 500])
def test_openai_backend_retries_transient_failures(status: int) -> None:
    srv = SyntheticCompletionsServer(failures=FailurePlan(first=3, status=status)).start()
    try:
        backend = OpenAICompletionsBackend(srv.url, "synthetic", concurrency=1, backoff_s=0.01)
        out = backend.generate([GenerationRequest(CTX, (5,))], SamplingParams())
        assert len(out[0]) == 1 and backend.retries == 3 and srv.requests == 4
    finally:
        srv.stop()


def test_openai_backend_retries_a_timed_out_request() -> None:
    srv = SyntheticCompletionsServer(failures=FailurePlan(first=1, status=0, stall_s=2.0)).start()
    try:
        backend = OpenAICompletionsBackend(srv.url, "synthetic", timeout_s=0.3, backoff_s=0.01)
        out = backend.generate([GenerationRequest(CTX, (5,))], SamplingParams())
        assert len(out[0]) == 1 and backend.retries == 1
    finally:
        srv.stop()


def test_openai_backend_gives_up_clearly() -> None:
    srv = SyntheticCompletionsServer(failures=FailurePlan(first=100, status=503)).start()
    try:
        backend = OpenAICompletionsBackend(srv.url, "synthetic", max_retries=2, backoff_s=0.01)
        with pytest.raises(ServerError, match="HTTP 503"):
            backend.generate([GenerationRequest(CTX, (5,))], SamplingParams())
        assert srv.requests == 3
    finally:
        srv.stop()
    bad = SyntheticCompletionsServer(failures=FailurePlan(first=100, status=400)).start()
    try:
        backend = OpenAICompletionsBackend(bad.url, "synthetic", max_retries=5, backoff_s=0.01)
        with pytest.raises(ServerError, match="HTTP 400"):
            backend.generate([GenerationRequest(CTX, (5,))], SamplingParams())
        assert bad.requests == 1, "a 400 is not retried"
    finally:
        bad.stop()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = OpenAICompletionsBackend(f"http://127.0.0.1:{port}/v1", "x", max_retries=1, backoff_s=0.01)
    with pytest.raises(ServerError):
        backend.generate([GenerationRequest(CTX, (1,))], SamplingParams())


# --- vLLM -------------------------------------------------------------------------------


@dataclass
class _Sample:
    text: str
    token_ids: list[int]
    finish_reason: str


@dataclass
class _RequestOutput:
    prompt: str
    outputs: list[_Sample]
    prompt_token_ids: list[int] | None = None


def test_vllm_requests_and_results() -> None:
    reqs = [GenerationRequest("p0", (7, 8)), GenerationRequest("p1", (9,))]
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=8192, stop=("</chunk>",))
    calls = build_engine_calls(reqs, params, per_sample_seeds=True)
    assert [(c.request_index, c.prompt, c.sampling["seed"], c.sampling["n"]) for c in calls] == [
        (0, "p0", 7, 1),
        (0, "p0", 8, 1),
        (1, "p1", 9, 1),
    ]
    assert calls[0].sampling == {
        "temperature": 1.0,
        "top_p": 0.95,
        "max_tokens": 8192,
        "stop": ["</chunk>"],
        "n": 1,
        "seed": 7,
    }
    grouped = build_engine_calls(reqs, params, per_sample_seeds=False)
    assert [(c.sampling["n"], c.sampling["seed"]) for c in grouped] == [(2, 7), (1, 9)]
    outputs = [
        _RequestOutput("p0", [_Sample("a", [1, 2], "stop"), _Sample("b", [3], "length")], [5, 6, 7]),
        _RequestOutput("p1", [_Sample("c", [], "stop")]),
    ]
    parsed = read_engine_outputs(grouped, outputs, 2)
    assert [[(c.text, c.tokens, c.finish_reason, c.prompt_tokens) for c in row] for row in parsed] == [
        [("a", 2, "stop", 3), ("b", 1, "length", 3)],
        [("c", 0, "stop", None)],
    ]
    with pytest.raises(RuntimeError):
        read_engine_outputs(grouped, outputs[:1], 2)


def test_vllm_backend_says_when_vllm_is_missing() -> None:
    from stepq.models.errors import ConfigError

    with pytest.raises(ConfigError, match="vLLM is not installed"):
        make_backend("vllm", {"model": "x"})


# --- transformers -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stepq.trainer.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def test_hf_backend_seeding_stopping_tokens_batching(tiny_model: Path) -> None:
    backend = HFBackend(str(tiny_model), batch_size=3)
    params = SamplingParams(max_tokens=10)
    reqs = [GenerationRequest(CTX, (1, 2)), GenerationRequest("short", (3,))]
    a, b = backend.generate(reqs, params), backend.generate(reqs, params)
    assert a == b, "same seeds, same completions"
    assert [len(row) for row in a] == [2, 1]
    assert all(0 < c.tokens <= 10 for row in a for c in row)
    # batched with left padding, each continued its own context and no padding
    assert [[c.prompt_tokens for c in row] for row in a] == [[len(CTX)] * 2, [len("short")]]
    other = backend.generate([GenerationRequest(CTX, (4, 5)), GenerationRequest("short", (6,))], params)
    assert other != a, "other seeds, other completions"
    exact = HFBackend(str(tiny_model), per_sample_seeds=True)
    alone = exact.generate([GenerationRequest(CTX, (1,))], params)[0][0]
    together = exact.generate([GenerationRequest("short", (9,)), GenerationRequest(CTX, (1,))], params)[1][0]
    assert alone == together, "per-sample seeds do not depend on the batch"
    full = backend.generate([GenerationRequest(CTX, (1,))], SamplingParams(max_tokens=40))[0][0]
    stop = next(ch for ch in full.text[1:] if ch.strip())
    cut = backend.generate([GenerationRequest(CTX, (1,))], SamplingParams(max_tokens=40, stop=(stop,)))[0][0]
    assert cut.text == full.text[: full.text.index(stop, 1) if full.text[0] == stop else full.text.index(stop)]
    assert cut.finish_reason == "stop" and cut.tokens == len(cut.text)


def test_hf_backend_keeps_context_and_completion_inside_the_window(tmp_path: Path) -> None:
    """A rollout from a long prefix of a small model: generating past its positions would index
    out of its position table (an IndexError retried forever); it is cut at the window
    instead, and a context that fills the window fails its work item at once."""
    from stepq.models.errors import GenerationError
    from stepq.trainer.tiny_model import build_tiny_model

    backend = HFBackend(str(build_tiny_model(tmp_path / "small", n_positions=48)), batch_size=4)
    assert backend.context_window == 48
    long_ctx, params = "x" * 40, SamplingParams(max_tokens=30)
    short = backend.generate([GenerationRequest("short", (3,))], params)
    mixed = backend.generate([GenerationRequest("short", (3,)), GenerationRequest(long_ctx, (1, 2))], params)
    assert mixed[0] == short[0], "a context that fits is batched as before"
    assert all(c.tokens <= 8 and c.prompt_tokens == 40 for c in mixed[1])
    assert all(c.finish_reason == "length" for c in mixed[1] if c.tokens == 8)
    with pytest.raises(GenerationError, match="fills the model's window") as failed:
        backend.generate([GenerationRequest("y" * 48, (1,))], params)
    assert failed.value.permanent


def test_hf_backend_batches_contexts_near_the_window_and_ends_each_where_it_would_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generative judge's prompts are all near a small model's window; one batch each made
    scoring a pool cost a generation call a chunk.  They share batches now, cut at the
    tightest room, and a row stopped short of its own room is generated again alone."""
    from stepq.trainer.tiny_model import build_tiny_model

    backend = HFBackend(str(build_tiny_model(tmp_path / "small", n_positions=48)), batch_size=4)
    greedy = SamplingParams(temperature=0.0, max_tokens=30)
    contexts = ["a" * 30, "b" * 34, "c" * 38, "d" * 36]  # rooms 18, 14, 10, 12: all near the window
    alone = [backend.generate([GenerationRequest(ctx, (1,))], greedy)[0][0] for ctx in contexts]
    calls: list[tuple[int, int]] = []
    generate_batch = backend._generate_batch

    def counted(part: Any, params: SamplingParams, max_new: int) -> Any:
        calls.append((len(part), max_new))
        return generate_batch(part, params, max_new)

    monkeypatch.setattr(backend, "_generate_batch", counted)
    together = [row[0] for row in backend.generate([GenerationRequest(ctx, (1,)) for ctx in contexts], greedy)]
    assert calls[0] == (4, 10), "one batch, cut at the tightest room"
    rooms = [48 - len(ctx) for ctx in contexts]
    again = sorted(room for c, room in zip(alone, rooms, strict=True) if room > 10 and c.tokens >= 10)
    assert again, "the random model wrote past the cut somewhere: the case tests the second call"
    assert calls[1:] == [(1, room) for room in again], "only a row the cut stopped short goes again, alone"
    assert [c.text for c in together] == [c.text for c in alone], "each ends where it would alone"
    assert all(c.tokens <= room for c, room in zip(together, rooms, strict=True))


def test_cut_at_stop() -> None:
    assert cut_at_stop("abc</chunk>def", ["</chunk>"]) == ("abc", True)
    assert cut_at_stop("abcdef", ["x", "d"]) == ("abc", True)
    assert cut_at_stop("abc", []) == ("abc", False)


# --- exact continuation, every backend ----------------------------------------------------


class Recording:
    """Wraps a backend and records the contexts it was asked to continue."""

    def __init__(self, inner: GenerationBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.contexts: list[str] = []

    @property
    def generator(self) -> str:
        return self.inner.generator

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> Any:
        self.contexts.extend(r.context for r in requests)
        return self.inner.generate(requests, params)

    def close(self) -> None:
        self.inner.close()


def _spy_on_model_inputs(backend: HFBackend) -> list[str]:
    """Decode the token ids the model's ``generate`` actually receives (padding dropped by
    its attention mask, special tokens kept: a BOS added to a raw prompt would show)."""
    received: list[str] = []
    original = backend.model.generate

    def spy(**kwargs: Any) -> Any:
        for ids, mask in zip(kwargs["input_ids"].tolist(), kwargs["attention_mask"].tolist(), strict=True):
            received.append(backend.tokenizer.decode([i for i, keep in zip(ids, mask, strict=True) if keep]))
        return original(**kwargs)

    backend.model.generate = spy
    return received


@pytest.mark.parametrize("kind", ["synthetic", "openai", "hf"])  # vllm: tests/test_vllm.py, real engine
def test_rollouts_continue_the_exact_trajectory_prefix(
    kind: str, sqlite: Database, server: SyntheticCompletionsServer, tiny_model: Path
) -> None:
    synth_set(sqlite, "x", problems=3, seed=2)
    configure_annotation(sqlite, "x", 2)
    transport: list[str]
    if kind == "synthetic":
        inner: GenerationBackend = make_backend("synthetic")
    elif kind == "openai":
        inner = OpenAICompletionsBackend(server.url, "synthetic")
    else:
        inner = HFBackend(str(tiny_model), batch_size=8)
        received = _spy_on_model_inputs(inner)
    backend = Recording(inner)
    run_in_process(sqlite, worker_runtime(sqlite, WorkerOptions(name="t"), backend=backend))
    expected = set()
    with sqlite.session() as s:
        for tid in queries.set_trajectory_ids(s, queries.get_set(s, "x").id):
            ctx = queries.load_work_context(s, tid)
            prefix = ctx.trajectory.prompt
            for chunk in ctx.chunks:
                expected.add(prefix)
                prefix += chunk.text
            assert prefix == ctx.trajectory.prompt + ctx.trajectory.text
    assert set(backend.contexts) == expected
    if kind == "openai":
        transport = server.prompts
    elif kind == "hf":
        transport = received
    else:
        transport = backend.contexts
    assert set(transport) == expected, "what reached the model is byte-identical to the prefix"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_sampling_params_out_of_range_are_refused_naming_the_field(config: dict, field: str) -> None:
    from stepq.models.errors import ConfigError
    from stepq.workers.backends.base import SamplingParams

    with pytest.raises(ConfigError, match=f"^{field}: "):
        SamplingParams.from_config(config)
    assert SamplingParams.from_config({"temperature": 0, "top_p": 1, "max_tokens": 1}).temperature == 0


def test_a_server_error_that_echoes_the_key_is_stored_without_it() -> None:
    """A 401 body that repeats the request's bearer token becomes the item's stored error and a
    log line: the key is scrubbed from it first."""
    import http.server
    import threading

    secret = "sk-verysecret-0123456789"

    class Echo(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = f"unauthorized: {self.headers.get('Authorization')} ({secret[:6]}...)".encode()
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        backend = OpenAICompletionsBackend.from_config(
            {"base_url": f"http://127.0.0.1:{httpd.server_port}/v1", "model": "m", "max_retries": 0}, api_key=secret
        )
        with pytest.raises(ServerError) as failed:
            backend.generate([GenerationRequest(CTX, (1,))], SamplingParams(max_tokens=4))
        backend.close()
    finally:
        httpd.shutdown()
    message = str(failed.value)
    assert "HTTP 401" in message and "unauthorized: Bearer ***" in message and secret not in message


def test_a_worker_of_another_policy_takes_none_of_an_unpinned_synthetic_set(tmp_path: Path) -> None:
    """The set's own config names its policy: a worker of another one refuses its work even when it
    comes first (the set not yet pinned by any write), so it can never pin the set to itself."""
    from stepq.migrations import upgrade
    from stepq.workers.backends.synthetic import SyntheticBackend

    url = f"sqlite:///{tmp_path / 's.db'}"
    upgrade(url)
    db = Database(url)
    synth_set(db, "one", problems=3, seed=4)
    configure_annotation(db, "one", 2)
    odd = SyntheticBackend.from_config({"error_rate": 0.3})
    outcomes = run_in_process(db, worker_runtime(db, WorkerOptions(name="odd"), backend=odd))
    with db.session() as s:
        pset = queries.get_set(s, "one")
        assert pset.generator is None, "nothing pinned"
    assert set(outcomes) == {"failed"} and sum(outcomes.values()) == 3, outcomes
    with db.engine.connect() as conn:
        from sqlalchemy import text

        assert conn.execute(text("SELECT count(*) FROM rollouts")).scalar_one() == 0
        errors = [e for (e,) in conn.execute(text("SELECT last_error FROM rollout_work"))]
    assert all("set 'one' names synthetic(err=0.1" in e and "err=0.3" in e for e in errors), errors


def test_a_long_trajectorys_work_holds_its_text_once_not_every_prefix(tmp_path: Path) -> None:
    """Every prefix kept as its own string grew with the square of the steps (a 10,000-step
    trajectory took 2.3 GB in the worker); the job keeps the text once and cuts a batch's
    contexts from it, each exactly the prompt and the first k chunks."""
    import json
    import tracemalloc

    from stepq.migrations import upgrade
    from stepq.workers.data.ingest import FieldMap, ingest_file
    from stepq.workers.jobqueue.runner import Claimed
    from stepq.workers.kinds import ROLLOUTS
    from stepq.workers.labelling.rollout_handler import TrajectoryJob

    steps = [f"Step {i}: add {i % 7} to get a number that is written out here.\n\n" for i in range(2000)]
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"id": "long", "problem": "Add.", "answer": "1", "steps": steps}) + "\n")
    url = f"sqlite:///{tmp_path / 's.db'}"
    upgrade(url)
    db = Database(url)
    ingest_file(db, path, "long", FieldMap(steps="steps"))
    configure_annotation(
        db, "long", 1, backend="openai", backend_config={"base_url": "http://127.0.0.1:9/v1", "model": "m"}
    )
    rt = worker_runtime(db, WorkerOptions(name="w"))
    from sqlalchemy import select

    from stepq.models import RolloutWork

    with db.session() as s:
        (work_id,) = s.scalars(select(RolloutWork.id)).all()
        ctx = queries.load_work_contexts(s, list(queries.work_trajectories(s, [work_id]).values()))
    (context,) = ctx.values()
    tracemalloc.start()
    job = TrajectoryJob(Claimed(rt, ROLLOUTS, [work_id]), work_id, context)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8_000_000, f"{peak / 1e6:.0f} MB to set up one trajectory's work"  # every prefix: ~120 MB
    chunks = [c.text for c in context.chunks]
    assert len(chunks) == 2000
    for k in (0, 1, 1000, 2000):
        assert job.prefix(k) == context.trajectory.prompt + "".join(chunks[:k])
