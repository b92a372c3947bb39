"""What a non-editable install ships (pyproject.toml's explicit package list): every package
of the source tree, so `pip install .` runs what the tree runs."""

from __future__ import annotations

import pathlib
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # the tomli backport, a dependency below 3.11
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _config() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def test_every_package_of_the_tree_is_listed_for_the_wheel() -> None:
    config = _config()
    tree = set()
    for name, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                tree.add(".".join((name, *init.parent.relative_to(ROOT / folder).parts)))
    listed = set(config["packages"])
    assert tree - listed == set(), "packages a wheel would lack"
    assert listed - tree == set(), "listed packages with no folder"

