"""The package list, derived from the folders: pyproject.toml's ``package-dir`` maps the
top-level folders (models/, workers/, trainer/, migrations/) under the one import name
``stepq``, and every folder below them with an ``__init__.py`` is a package of it.  Nothing
else is configured here (pyproject.toml holds the rest)."""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
FOLDERS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
LINKED = {folder for name, folder in FOLDERS.items() if name != "stepq"}
"""In a checkout, stepq/models etc. are symlinks to these folders: found once, under their own mapping."""


def packages() -> list[str]:
    found = set()
    for name, folder in FOLDERS.items():
        found.add(name)
        for sub in find_packages(str(ROOT / folder)):
            if name == "stepq" and sub.split(".")[0] in LINKED:
                continue
            found.add(f"{name}.{sub}")
    return sorted(found)


setup(packages=packages())
