"""Every ``stepq`` command in the README's and docs' code blocks exists as written: each
resolves through the real CLI with its options and values (a renamed command or a dropped
option fails here).  Running them all needs GPUs, models and data a test machine lacks;
the ones that can run are run by the tests of their feature."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from stepq.cli import main

ROOT = Path(__file__).resolve().parents[1]
SHELL = ("bash", "sh", "console", "shell", "")


def shell_blocks(text: str) -> list[str]:
    """The contents of the fenced blocks marked as shell (or unmarked)."""
    blocks, current, language = [], [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if language is None:
                language, current = line[3:].strip(), []
            else:
                if language in SHELL:
                    blocks.append("\n".join(current) + "\n")
                language = None
        elif language is not None:
            current.append(line)
    return blocks


def commands() -> list[tuple[str, str]]:
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]:
        for block in shell_blocks(doc.read_text(encoding="utf-8")):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #", 1)[0].strip().removeprefix("$ ")
                if line.startswith("#"):
                    continue
                for part in re.split(r"\s*(?:&&|\|\||;|\||&)\s*", line):
                    if part.startswith("stepq "):
                        found.append((f"{doc.relative_to(ROOT)}", part))
                    elif " -m stepq " in part:  # under a launcher: torchrun … -m stepq train …
                        found.append((f"{doc.relative_to(ROOT)}", "stepq " + part.split(" -m stepq ", 1)[1]))
    return found


def _resolve(argv: list[str]) -> None:
    cmd: click.Command = main
    ctx = click.Context(main, info_name="stepq")
    args = list(argv)
    while isinstance(cmd, click.Group):
        if not args or args[0] in ("--help", "--version"):
            return
        if args[0].startswith("-") and cmd.invoke_without_command:
            break  # the group runs itself with these options (stepq train --snapshot N)
        sub = cmd.get_command(ctx, args[0])
        assert sub is not None, f"stepq has no command {args[0]!r}"
        cmd, args = sub, args[1:]
        ctx = click.Context(cmd, info_name=cmd.name, parent=ctx)
    if "--help" in args:
        return
    # resolve_path and exists checks need the files: parse the options, not the paths
    parser = cmd.make_parser(ctx)
    values, rest, _ = parser.parse_args(args=list(args))
    names = {p.name for p in cmd.params}
    assert set(values) <= names, f"unknown option(s) {set(values) - names}"
    arguments = [p for p in cmd.params if isinstance(p, click.Argument)]
    assert not rest or arguments, f"unexpected argument(s) {rest}"


@pytest.mark.parametrize(("doc", "command"), commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_documented_command_exists(doc: str, command: str) -> None:
    try:
        argv = shlex.split(command)[1:]
    except ValueError as exc:
        pytest.fail(f"{doc}: cannot parse {command!r}: {exc}")
    try:
        _resolve(argv)
    except click.UsageError as exc:
        pytest.fail(f"{doc}: {command!r}: {exc.format_message()}")


LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def test_relative_links_resolve_inside_the_repository() -> None:
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]:
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (doc.parent / target).resolve()
            if not path.exists() or ROOT not in (path, *path.parents):
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_anchors_of_links_exist() -> None:
    """A link to a section (``file.md#section``) names a heading that file has."""

    def anchors(path: Path) -> set[str]:
        found, fenced = set(), False
        for line in path.read_text(encoding="utf-8").splitlines():
            fenced ^= line.startswith("```")
            if not fenced and line.startswith("#"):
                title = line.lstrip("#").strip().lower()
                found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
        return found

    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]:
        for target, anchor in re.findall(r"\]\(([^)\s#]*)#([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            path = (doc.parent / target).resolve() if target else doc
            if path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{doc.relative_to(ROOT)} -> {target}#{anchor}")
    assert not broken, broken


def test_the_readme_is_a_front_door_and_no_path_leads_outside_the_repository() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    outside = []
    for doc in [
        ROOT / "README.md",
        *sorted((ROOT / "tests" / "data").glob("*.md")),
        *sorted((ROOT / "docs").glob("**/*.md")),
    ]:
        for path in re.findall(r"(?<![\w/.])((?:\.\./)+[\w./-]+)", doc.read_text(encoding="utf-8")):
            # a path read from the document or from the repository root (a link, a command's
            # argument) must stay inside the clone and resolve either way
            if not all(ROOT in (base / path).resolve().parents for base in (doc.parent, ROOT)):
                outside.append(f"{doc.relative_to(ROOT)}: {path}")
    assert not outside, outside


def test_the_generated_references_match_the_code() -> None:
    """docs/cli-reference.md and docs/configuration.md are generated from the click commands
    and the Settings object: a new option or setting without regenerating
    (``python -m stepq.reference``) fails here."""
    from stepq.reference import generated

    stale = [
        str(path.relative_to(ROOT))
        for path, text in generated().items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"regenerate with 'python -m stepq.reference': {stale}"


def test_every_variable_the_package_reads_is_in_the_configuration_reference() -> None:
    """A ``STEPQ_*`` name anywhere in the package's code is a setting (or one of the few the
    reference lists beside them): none is read that an operator cannot look up."""
    reference = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    named = set()
    for folder in ("stepq", "models", "workers", "trainer", "migrations"):
        for path in (ROOT / folder).rglob("*.py"):
            if folder == "stepq" and path.relative_to(ROOT / folder).parts[0] in {
                "models",
                "workers",
                "trainer",
                "migrations",
            }:
                continue
            named |= set(re.findall(r"\bSTEPQ_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    missing = sorted(name for name in named if f"`{name}`" not in reference)
    assert not missing, missing


def test_every_fact_in_the_methods_page_names_its_source() -> None:
    """docs/methods.md: each row of its tables cites the paper and part that states it, or
    marks what no paper states as stepq's choice (a row with neither credits a paper for
    nothing it can be checked against)."""
    text = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    facts = [r for r in rows if not r.startswith("| |")]
    assert len(facts) > 30
    for row in facts:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 4, row
        _, published, source, ours = cells
        cited = source.startswith(
            ("SW,", "PSR,", "OPRM,", "ProcessBench", "OmegaPRM and PRM800K", "Math-Shepherd,", "GenPRM and ThinkPRM,")
        )
        assert cited or (source == "—" and "**stepq**" in ours), f"no source and not marked stepq's: {row}"
        assert source != "—" or published.startswith(("not ", "not in")), f"a published fact with no source: {row}"


def test_the_documented_exit_codes_are_the_codes_stepq_exits_with() -> None:
    """docs/commands.md lists every exit code the code can end with, and no other: the error
    tree's codes, the internal error's and a hung worker's."""
    from stepq.commands.base import INTERNAL_ERROR
    from stepq.models import errors
    from stepq.workers.jobqueue.runtime import GENERATE_TIMEOUT_EXIT

    def subclasses(cls: type) -> set[type]:
        return {cls}.union(*(subclasses(c) for c in cls.__subclasses__()))

    in_code = {c.exit_code for c in subclasses(errors.StepqError) if c is not errors.StepqError}
    in_code |= {INTERNAL_ERROR, GENERATE_TIMEOUT_EXIT}
    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    paragraph = text[text.index("Errors are one line") : text.index("traceback).")]
    documented = {int(n) for n in re.findall(r"(?:^|[,:]\s|\),\s)(\d+) [a-z]", paragraph.replace("\n", " "))}
    assert documented == in_code, (documented, in_code)
