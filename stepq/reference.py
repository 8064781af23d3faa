"""The CLI and configuration references in ``docs/``, generated from the click
commands and the ``Settings`` object, so they cannot drift from the code: a test regenerates
them and fails on any difference.

    python -m stepq.reference          # rewrite docs/cli-reference.md, docs/configuration.md
    python -m stepq.reference --check  # exit 1 if they are stale
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from stepq.settings import PREFIX, Settings

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"cli-reference.md": "cli_reference", "configuration.md": "configuration_reference"}
OTHER_VARIABLES = {
    "STEPQ_DEBUG": "1: an unforeseen error (exit 70) prints its traceback.",
    "STEPQ_DATA_DIR": "A folder with the public data sets for benchmarks (without it, the repository's data/).",
    "STEPQ_TRACE_DIR": "A training run writes each rank's prompts there (to check how DDP shares them).",
    "STEPQ_FLOWER_BASIC_AUTH": "docker-compose: Flower's user:password (it has no default).",
}


def _commands(group: click.Group, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    ctx = click.Context(group, info_name=path[-1])
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("``", "`").replace("|", "\\|")


def _option_row(param: click.Parameter) -> str:
    names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    kind = param.type.name if not getattr(param, "is_flag", False) else "flag"
    if isinstance(param.type, click.Choice):
        kind = " | ".join(str(c) for c in param.type.choices)
    default = param.default
    unset = default is None or default == () or "Sentinel" in type(default).__name__
    shown = "" if unset or getattr(param, "is_flag", False) else f"`{default}`"
    required = " (required)" if param.required else ""
    return f"| {names} | {_cell(kind)} | {shown} | {_cell(getattr(param, 'help', None) or '')}{required} |"


def cli_reference() -> str:
    """Every ``stepq`` command: its usage line, what it does, its options."""
    from stepq.cli import main

    out = [
        "# CLI reference",
        "",
        "Generated from the commands by `python -m stepq.reference`; do not edit by hand. The",
        "[commands guide](commands.md) explains exit codes and how the commands fit together.",
        "",
    ]
    for path, command in _commands(main, ("stepq",)):
        ctx = click.Context(command, info_name=" ".join(path), terminal_width=100, max_content_width=100)
        usage = command.get_usage(ctx).removeprefix("Usage: ")
        out += [f"## {' '.join(path)}", "", "```text", usage, "```", ""]
        if command.help:
            out += [inspect.cleandoc(command.help).split("\f")[0].strip(), ""]
        options = [p for p in command.params if isinstance(p, click.Option) and not p.hidden]
        arguments = [p for p in command.params if isinstance(p, click.Argument)]
        if arguments:
            out += ["Arguments: " + ", ".join(f"`{a.human_readable_name}`" for a in arguments), ""]
        if options:
            out += ["| option | type | default | meaning |", "| --- | --- | --- | --- |"]
            out += [_option_row(p) for p in options]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _field_docs() -> dict[str, str]:
    """The attribute docstrings of ``Settings`` (the string after each field)."""
    tree = ast.parse(inspect.cleandoc(inspect.getsource(Settings)))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef)).body
    docs: dict[str, str] = {}
    for node, after in zip(body, [*body[1:], None], strict=True):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            is_doc = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            docs[node.target.id] = inspect.cleandoc(str(after.value.value)) if is_doc else ""  # type: ignore[union-attr]
    return docs


def configuration_reference() -> str:
    """Every setting: its variable, default and meaning, from ``Settings``."""
    docs = _field_docs()
    out = [
        "# Configuration reference",
        "",
        "Generated from `stepq.settings.Settings` by `python -m stepq.reference`; do not edit by",
        "hand. Every setting is read from the environment once, as `STEPQ_<NAME>`; a malformed",
        "value is a configuration error (exit 2).",
        "",
        "| variable | default | meaning |",
        "| --- | --- | --- |",
    ]
    for f in dataclasses.fields(Settings):
        default = f.default
        shown = "" if default == "" else f"`{str(default).lower() if isinstance(default, bool) else default}`"
        out.append(f"| `{PREFIX}{f.name.upper()}` | {shown} | {_cell(docs.get(f.name, ''))} |")
    out += ["", "Outside the settings object:", "", "| variable | meaning |", "| --- | --- |"]
    out += [f"| `{name}` | {meaning} |" for name, meaning in OTHER_VARIABLES.items()]
    return "\n".join(out) + "\n"


def generated() -> dict[Path, str]:
    module = sys.modules[__name__]
    return {ROOT / "docs" / name: getattr(module, fn)() for name, fn in TARGETS.items()}


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    stale = []
    for path, text in generated().items():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{'stale' if check else 'wrote'}: {path.relative_to(ROOT)}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
