"""The README's commands that need no service and no model run as written: in a fresh folder,
offline, on the base install (every optional package blocked, as after ``pip install -e .``),
with the repository's shipped ``data/`` where a command names it."""

from __future__ import annotations

import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, clean_env

OPTIONAL = ("torch", "transformers", "trl", "datasets", "accelerate", "vllm")
EXTRAS_BLOCKED = f"import sys\nfor m in {OPTIONAL!r}:\n    sys.modules[m] = None\n"
"""A sitecustomize that makes every optional package unimportable: the base install."""


def _blocks(section: str, language: str) -> list[str]:
    """The ``language`` code blocks of the README section whose heading is ``section``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end > 0 else None]
    return re.findall(rf"```{language}\n(.*?)```", body, re.S)


def _commands(block: str) -> list[list[str]]:
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(line))
    return out


@pytest.fixture
def base_install(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(EXTRAS_BLOCKED)
    (tmp_path / "data").symlink_to(ROOT / "data")  # the clone's shipped data, as the README names it
    return clean_env(PYTHONPATH=str(site), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "stepq", argv
    return subprocess.run(
        [sys.executable, "-m", "stepq", *argv[1:]], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )


def test_the_quick_start_and_the_tour_run_as_written(tmp_path: Path, base_install: dict[str, str]) -> None:
    (quick,) = [b for b in _blocks("Quick start", "bash") if "stepq run" in b]
    assert quick.strip() == "pip install -e . && stepq run", "the quick start is the base install, then the run"
    done = _run(["stepq", "run"], base_install, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "labels agree with the synthetic step-level ground truth" in done.stdout, done.stdout
    assert (tmp_path / "stepq.db").is_file(), "the embedded default: stepq.db in the working directory"

    tour = _blocks("A five-minute tour", "bash")[0]
    commands = _commands(tour)
    assert len(commands) == 7
    for argv in commands:
        done = _run(argv, base_install, tmp_path)
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
    assert any((tmp_path / "exports" / "tour-v1").iterdir()), "the snapshot was exported"
    (sql,) = _blocks("A five-minute tour", "sql")
    with sqlite3.connect(tmp_path / "stepq.db") as conn:
        rows = dict((r[0], r[1:]) for r in conn.execute(sql))
    assert rows["tour"][0] == rows["tour"][1] == 40, "every trajectory of the tour's set is done"


def test_the_readmes_shipped_data_ingests_as_written(tmp_path: Path, base_install: dict[str, str]) -> None:
    """The at-scale block's ingest names a file the clone ships (the rest of that block needs
    PostgreSQL, Redis and model weights)."""
    at_scale = next(b for b in _blocks("A five-minute tour", "bash") if "stepq ingest" in b)
    (ingest,) = [argv for argv in _commands(at_scale) if argv[:2] == ["stepq", "ingest"]]
    done = _run(ingest, base_install, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "500 records, 500 new problems" in done.stdout
    evaluate = next(b for b in _blocks("A five-minute tour", "bash") if "eval processbench" in b)
    (argv,) = [a for a in _commands(evaluate) if a[:3] == ["stepq", "eval", "processbench"]]
    files = argv[argv.index("--data") + 1 : argv.index("--judge")]
    assert files and all((tmp_path / f).is_file() for f in files), "ProcessBench's subsets ship in data/"
