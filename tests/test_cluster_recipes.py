"""The Slurm and Kubernetes recipes in deploy/, checked by what runs here: the shell parses,
the manifests parse and hold the fields their jobs rely on, every stepq command they run exists
with the options they pass, and the liveness probe answers from a real worker row."""

from __future__ import annotations

import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from stepq.models import Database

ROOT = Path(__file__).resolve().parents[1]
SLURM = sorted((ROOT / "deploy" / "slurm").glob("*.sbatch"))
KUBERNETES = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))


def _manifests() -> dict[str, dict[str, Any]]:
    out = {}
    for path in KUBERNETES:
        for doc in yaml.safe_load_all(path.read_text()):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def _resolves(argv: list[str]) -> None:
    """``stepq ARGV`` names a command that exists, and each ``--option`` it passes is one of
    that command's (values with $VARIABLES are the caller's to fill)."""
    from stepq.cli import main

    command: Any = main
    rest = list(argv)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        assert name in command.commands, f"stepq has no command {name!r} ({' '.join(argv)})"
        command = command.commands[name]
    assert not isinstance(command, click.Group), f"'stepq {' '.join(argv)}' stops at a group"
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    for token in rest:
        if token.startswith("--"):
            assert token.split("=")[0] in known, f"'stepq {' '.join(argv)}': no option {token}"


def _stepq_lines(script: str) -> list[list[str]]:
    """The stepq invocations of a shell script (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", script)
    calls = []
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("#"):
            continue
        words = shlex.split(line.removeprefix("exec "), comments=True) if "stepq " in line else []
        if words and words[0] == "stepq":
            calls.append(words[1:])
    return calls


@pytest.mark.parametrize("path", SLURM, ids=[p.name for p in SLURM])
def test_each_slurm_script_parses_requeues_and_runs_real_commands(path: Path) -> None:
    text = path.read_text()
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    directives = dict(
        (m.group(1), m.group(2)) for m in re.finditer(r"^#SBATCH --([\w-]+)(?:=(\S+))?", text, re.MULTILINE)
    )
    assert "requeue" in directives, "a preempted job comes back"
    assert directives.get("signal", "").startswith("B:TERM@"), "the batch process (stepq, exec'd) gets SIGTERM first"
    for var in ("STEPQ_DATABASE_URL", "STEPQ_BROKER_URL"):
        assert re.search(rf'^: "\$\{{{var}:\?', text, re.MULTILINE), f"{path.name} refuses to start without {var}"
    calls = _stepq_lines(text)
    assert calls
    for argv in calls:
        _resolves(argv)
    if path.name == "workers.sbatch":
        assert "array" in directives and directives.get("gres") == "gpu:1", "one worker per GPU, as an array"
        (worker,) = [a for a in calls if a[0] == "worker"]
        assert worker[worker.index("--pool") + 1] == "solo" and worker[worker.index("--backend") + 1] == "vllm"


def test_a_slurm_script_without_its_urls_stops_before_running_anything(tmp_path: Path) -> None:
    for path in SLURM:
        bash = shutil.which("bash") or "/bin/bash"
        proc = subprocess.run([bash, str(path)], capture_output=True, text=True, env={"PATH": str(tmp_path)})
        assert proc.returncode != 0 and "export STEPQ_DATABASE_URL" in proc.stderr, proc.stderr


def test_the_kubernetes_manifests_hold_what_their_jobs_rely_on() -> None:
    docs = _manifests()
    assert set(docs) == {
        "Secret/stepq",
        "Job/stepq-migrate",
        "Deployment/stepq-dispatcher",
        "Deployment/stepq-worker",
    }
    secret_keys = set(docs["Secret/stepq"]["stringData"])
    for name, doc in docs.items():
        if doc["kind"] == "Secret":
            continue
        assert doc["apiVersion"] == {"Deployment": "apps/v1", "Job": "batch/v1"}[doc["kind"]]
        spec = doc["spec"]["template"]["spec"]
        if doc["kind"] == "Deployment":
            assert doc["spec"]["selector"]["matchLabels"] == doc["spec"]["template"]["metadata"]["labels"], name
        assert spec["securityContext"]["runAsNonRoot"] is True, f"{name} runs unprivileged"
        for container in spec["containers"]:
            _resolves(container["args"])
            for env in container.get("env", []):
                ref = env["valueFrom"]["secretKeyRef"]
                assert ref["name"] == "stepq" and ref["key"] in secret_keys, f"{name}: {ref}"
            for probe in ("startupProbe", "livenessProbe"):
                if probe in container:
                    command = container[probe]["exec"]["command"]
                    assert command[0] == "stepq"
                    _resolves(command[1:])
    dispatcher = docs["Deployment/stepq-dispatcher"]
    assert dispatcher["spec"]["replicas"] == 1 and dispatcher["spec"]["strategy"]["type"] == "Recreate"
    worker = docs["Deployment/stepq-worker"]["spec"]["template"]["spec"]
    (container,) = worker["containers"]
    assert (
        container["resources"]["limits"]["nvidia.com/gpu"] == 1 == container["resources"]["requests"]["nvidia.com/gpu"]
    )
    assert container["livenessProbe"]["exec"]["command"][1] == "worker-alive"
    assert worker["terminationGracePeriodSeconds"] >= 300, "SIGTERM hands back the batch in flight"
    args = container["args"]
    assert args[args.index("--pool") + 1] == "solo", "one engine a pod, one task at a time"


def test_the_liveness_probe_reads_the_workers_row(pg: Database, pg_url: str, tmp_path: Path) -> None:
    """`stepq worker-alive` exits 0 for this host's fresh, healthy worker, 1 for a stale or an
    unhealthy one, or none."""
    from sqlalchemy import text

    from stepq.assembly import worker_runtime
    from stepq.workers.jobqueue.runtime import WorkerOptions
    from tests.helpers import clean_env, run_stepq

    env = clean_env(STEPQ_DATABASE_URL=pg_url)

    def probe(*extra: str) -> subprocess.CompletedProcess[str]:
        return run_stepq("worker-alive", *extra, env=env, cwd=tmp_path)

    missing = probe()
    assert missing.returncode == 1 and "no running worker of host" in missing.stderr
    rt = worker_runtime(pg, WorkerOptions(name="probe")).start()
    try:
        alive = probe()
        assert alive.returncode == 0 and "worker probe@" in alive.stdout, alive.stderr
        assert probe("--host", "another-host").returncode == 1
        with pg.engine.begin() as conn:
            conn.execute(
                text("UPDATE workers SET unhealthy = 'every job failed: no GPU' WHERE hostname = :h"),
                {"h": socket.gethostname()},
            )
        sick = probe()
        assert sick.returncode == 1 and "takes no work: every job failed" in sick.stderr
    finally:
        rt.close()
    assert probe().returncode == 1, "a stopped worker is not alive"
