"""The documented CPU install resolves PyTorch's CPU build (where its index can be reached)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cpu_command() -> list[str]:
    text = (ROOT / "docs" / "install.md").read_text()
    block = text.split("## On a machine without a GPU", 1)[1]
    line = re.search(r"^pip install torch\S* .*--index-url \S+$", block, re.MULTILINE)
    assert line is not None, "docs/install.md shows the CPU build's install command"
    return line.group(0).split()


def test_the_documented_cpu_install_names_the_cpu_index_and_the_tested_torch() -> None:
    args = _cpu_command()
    index = args[args.index("--index-url") + 1]
    assert index.rstrip("/").endswith("/whl/cpu")
    pinned = next(a for a in args if a.startswith("torch=="))
    extras = (ROOT / "pyproject.toml").read_text()
    assert f'"{pinned}"' in extras, "the torch the tests pin"
    for extra in ("hf", "train"):
        line = re.search(rf"^{extra} = \[(.*)\]$", extras, re.MULTILINE)
        assert line is not None and '"torch>=2.4,<2.14"' in line.group(1), f"[{extra}] admits the tested torch only"


def test_the_documented_cpu_install_resolves_the_cpu_build(tmp_path: Path) -> None:
    args = _cpu_command()
    index = args[args.index("--index-url") + 1]
    try:
        urllib.request.urlopen(index, timeout=5).close()
    except OSError as exc:
        pytest.skip(f"{index} cannot be reached from here ({exc}): nothing to resolve against")
    report = tmp_path / "report.json"
    pinned = next(a for a in args if a.startswith("torch=="))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet",
         "--report", str(report), "--index-url", index, pinned],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (item,) = json.loads(report.read_text())["install"]
    assert item["metadata"]["name"] == "torch" and item["metadata"]["version"].endswith("+cpu"), item["metadata"]
