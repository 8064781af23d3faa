"""The published facts (docs/facts.toml) against the page that states them and the code that
implements them: a value changed in any one of the three fails here.  A review changed "w = 6"
to "w = 8" and credited "T = 0.7" to StepWiser in docs/methods.md, and the name-only check
passed both."""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
FACTS = tomllib.loads((ROOT / "docs" / "facts.toml").read_text(encoding="utf-8"))["fact"]
LEGEND = (
    "**SW** is StepWiser (arXiv 2508.19229)",
    "**PSR** process-based self-rewarding",
    "**OPRM** learning discriminative PRMs from outcome labels alone",
)


def methods_rows(text: str) -> dict[str, tuple[str, str]]:
    """docs/methods.md's table rows: label -> (published, source)."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if len(cells) == 4 and cells[0]:
                rows[cells[0]] = (cells[1], cells[2])
    return rows


def default_of(where: str) -> Any:
    """The stepq default a fact's ``code`` names (see the header of docs/facts.toml)."""
    kind, _, ref = where.partition(":")
    if kind == "cli":
        from stepq.cli import main

        *path, option = ref.split()
        command: Any = main
        for name in path:
            command = command.commands[name]
        (param,) = [p for p in command.params if option in p.opts]
        assert isinstance(param, click.Option)
        return param.default
    if kind == "yaml":
        file, _, keys = ref.partition(":")
        value: Any = yaml.safe_load((ROOT / file).read_text(encoding="utf-8"))
        for key in keys.split("."):
            value = value[key]
        return value
    if kind == "py":
        module, _, name = ref.partition(":")
        if name.endswith(")"):
            function, _, param = name[:-1].partition("(")
            return inspect.signature(getattr(importlib.import_module(module), function)).parameters[param].default
        value = importlib.import_module(module)
        for part in name.split("."):
            value = getattr(value, part)
        return value
    raise AssertionError(f"unknown code reference {where!r}")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return bool(a == b)


@pytest.mark.parametrize("fact", FACTS, ids=[f["what"] for f in FACTS])
def test_each_fact_is_on_its_row_credited_to_its_paper_and_is_the_codes_default(fact: dict[str, Any]) -> None:
    rows = methods_rows((ROOT / "docs" / "methods.md").read_text(encoding="utf-8"))
    assert fact["row"] in rows, f"docs/methods.md has no row '{fact['row']}'"
    published, source = rows[fact["row"]]
    for text in fact["page"]:
        assert text in published, f"'{text}' is not in the published cell of '{fact['row']}': {published}"
    assert source.startswith(fact["paper"]) and fact["part"] in source, f"'{fact['row']}' is credited to {source}"
    if "code" in fact:
        codes, values = (
            (fact["code"], fact["value"]) if isinstance(fact["code"], list) else ([fact["code"]], [fact["value"]])
        )
        for code, value in zip(codes, values, strict=True):
            assert _same(default_of(code), value), f"{code} is {default_of(code)!r}, the paper's is {value!r}"


def test_every_number_the_page_publishes_is_a_fact() -> None:
    """A number in a "published" cell that no fact accounts for is a value nobody checks."""
    rows = methods_rows((ROOT / "docs" / "methods.md").read_text(encoding="utf-8"))
    for label, (published, _source) in rows.items():
        rest = published
        for fact in FACTS:
            if fact["row"] == label:
                for text in fact["page"]:
                    rest = rest.replace(text, "")
        assert not re.search(r"\d", rest), f"'{label}' publishes a number no fact in docs/facts.toml checks: {rest}"


def test_the_papers_are_named_with_their_ids_where_their_values_are_given() -> None:
    methods = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    for legend in LEGEND:
        assert legend in " ".join(methods.split()), legend
    training = " ".join((ROOT / "docs" / "training.md").read_text(encoding="utf-8").split())
    credited = "It follows StepWiser (arXiv 2508.19229, its experimental setup) where the paper states a setting:"
    assert credited in training
    stated = training.split(credited, 1)[1].split(". ", 1)[0]
    for fact in FACTS:
        if fact["row"] in {"samples per prompt", "learning rate", "clip-higher"}:
            for number in re.findall(r"\d[\d.e-]*", " ".join(fact["page"])):
                assert number in stated, f"training.md credits StepWiser without its {fact['what']} ({number})"


def test_a_changed_value_fails_the_check() -> None:
    """The review's two mutations, applied to a copy of the page: each is caught."""
    text = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    for before, after in (("| w = 6 |", "| w = 8 |"), ("| T = 0.5, top_p = 0.95 |", "| T = 0.7, top_p = 0.95 |")):
        assert before in text
        rows = methods_rows(text.replace(before, after))
        missing = [t for f in FACTS for t in f["page"] if f["row"] in rows and t not in rows[f["row"]][0]]
        assert missing, f"{after} went unnoticed"
