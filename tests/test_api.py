"""docs/api.md's examples, run as written, in order, in a fresh folder: the Python API does
what the commands do (they call it), with no private import."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"


def test_the_api_pages_examples_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) >= 5
    for block in blocks:
        for line in block.splitlines():
            imported = re.match(r"\s*(?:from|import)\s+(stepq[\w.]*)", line)
            assert imported is None or imported.group(1) == "stepq.api", f"a private import in the page: {line}"
    (tmp_path / "data").symlink_to(ROOT / "data")
    for key in [k for k in os.environ if k.startswith("STEPQ_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), namespace)
    assert (tmp_path / "api-demo.db").exists() and (tmp_path / "runs" / "first-prm" / "final").is_dir()
    status = namespace["status"]
    assert isinstance(status, dict) and status["sets"][0]["problem_set"] == "first"


def test_the_commands_make_their_calls_through_the_api() -> None:
    """The CLI parses and prints: the library calls a script makes are the ones it makes."""
    sources = {p.name: p.read_text() for p in (ROOT / "stepq" / "commands").glob("*.py")}
    calls = {
        "data.py": ("client().ingest(", "client().synth("),
        "annotation.py": ("client().annotate(",),
        "trainer.py": ("api.create_snapshot(", "client().export_snapshot(", "client().train(", "tiny_model as build"),
        "evaluation.py": ("evaluate_processbench(", "client().evaluate_best_of_n("),
    }
    for name, needles in calls.items():
        for needle in needles:
            assert needle in sources[name], f"stepq/commands/{name} does not call {needle}"
    for name, text in sources.items():
        for private in ("ingest_file(", "synth_set(", "configure_annotation(", "create_snapshot(db", "methods.train("):
            assert private not in text, f"stepq/commands/{name} calls {private} around the API"
