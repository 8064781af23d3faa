"""Installing stepq adds one import name, ``stepq``: never ``models``, ``workers``, ... which
users' own repositories very often have.  Checked on a wheel built from this checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IMPORT_ALL = """
import importlib, pkgutil, stepq
names = [m.name for m in pkgutil.walk_packages(stepq.__path__, "stepq.") if m.name != "stepq.migrations.env"]
for name in names:
    importlib.import_module(name)
print(len(names))
"""
"""Every ``stepq.*`` module (but Alembic's env script, which only runs inside Alembic)."""


def _modules_in_checkout() -> int:
    """How many modules the checkout's folders hold, counted the way an install names them."""
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    count = 0
    for prefix, folder in folders.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).parts
            if "__pycache__" in rel or (prefix, path.name) == ("stepq.migrations", "env.py"):
                continue
            if prefix == "stepq" and rel[0] in {"models", "workers", "trainer", "migrations"}:
                continue  # the checkout's symlinks to the top-level folders
            if all((ROOT / folder).joinpath(*rel[:i], "__init__.py").exists() for i in range(len(rel))):
                count += 1
    return count


def test_the_checkout_imports_every_module() -> None:
    """Run from the checkout (the editable install's view): every module imports."""
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == _modules_in_checkout() - 1  # walk_packages does not list stepq itself


def test_checkout_symlinks_point_at_the_top_level_folders() -> None:
    for name in ("models", "workers", "trainer", "migrations"):
        link = ROOT / "stepq" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # setuptools copies into build/lib and never removes what is there: a module deleted or
    # moved since an earlier build would ride along in this wheel (the build is this test's own)
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
            check=True,
            capture_output=True,
        )
    finally:
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    (whl,) = out.glob("stepq-*.whl")
    return whl


def test_wheel_adds_only_the_stepq_import_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"stepq"}
    for module in (
        "stepq/models/base.py",
        "stepq/workers/labelling/rollout_handler.py",
        "stepq/trainer/__init__.py",
        "stepq/migrations/env.py",
        "stepq/migrations/script.py.mako",
    ):
        assert module in names, module
    assert any(n.startswith("stepq/migrations/versions/") and n.endswith(".py") for n in names)


def test_installed_wheel_imports_and_migrates_beside_a_users_models_package(wheel: Path, tmp_path: Path) -> None:
    """Installed into a bare directory next to a user's own ``models`` package: both import,
    and the installed stepq migrates a database (Alembic finds its revisions in the wheel)."""
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    user = tmp_path / "user"
    (user / "models").mkdir(parents=True)
    (user / "models" / "__init__.py").write_text("MINE = True\n")
    db = tmp_path / "t.db"
    url = f"sqlite:///{db}"
    script = (
        "import models, stepq.models\n"
        f"assert models.MINE and stepq.models.__file__.startswith({str(target)!r})\n"
        + IMPORT_ALL
        + "from stepq.migrations import upgrade, current\n"
        f"upgrade({url!r}); print(current({url!r}))\n"
    )
    env = {"PYTHONPATH": f"{user}:{target}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], cwd=user, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    imported, revision = done.stdout.split("\n", 1)
    assert int(imported) == _modules_in_checkout() - 1, "the wheel misses a module (a package the setup did not find)"
    assert revision.strip(), "no revision after upgrade"


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in tests' helper modules: a test module importing another drags its
    dependencies (torch into a queue test) and couples tests that should fail alone."""
    import ast

    offenders = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("tests.test_")]
    assert not offenders, offenders
