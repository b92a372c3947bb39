"""What a non-editable install ships (pyproject.toml's explicit package list): every package
of the source tree, so `pip install .` runs what the tree runs."""

from __future__ import annotations

import pathlib
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # the tomli backport, a dependency below 3.11
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


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



# Imported, never declared, on purpose: none is a PyPI package a user would add to an install.
UNDECLARED = {
    "pyverbs": "rdma-core's Python bindings, from the OS (python3-pyverbs); only doctor reads "
               "devices through them, when present",
    "flash_attn": "a CUDA kernel built against the host's toolkit; decode uses it when present",
    "click": "imported only under typer < 0.24, which itself depends on click",
}


def _declared() -> dict[str, list[str]]:
    """pyproject's own requirements, as extras.declared reads an installed wheel's."""
    from mooncake_cli import extras

    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    lines = list(project["dependencies"]) + [
        f'{req.split(";")[0]}; extra == "{name}"'
        for name, reqs in project["optional-dependencies"].items() for req in reqs]
    return extras.declared(lines)


def _imports() -> dict[str, set[str]]:
    """Top-level third-party module -> the files of the package that import it."""
    import ast

    config = _config()
    found: dict[str, set[str]] = {}
    for folder in config["package-dir"].values():
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_declared() -> None:
    from mooncake_cli import extras

    declared = _declared()
    imports = _imports()
    assert {"torch", "numpy", "pydantic"} <= set(imports)  # the walk sees the package
    missing = {m: sorted(files) for m, files in imports.items()
               if m not in extras.OWN and m not in UNDECLARED
               and extras.distribution_of(m) not in declared}
    assert missing == {}, "imported but neither a dependency nor in an extra"


def test_the_extra_a_missing_package_names_is_defined() -> None:
    from mooncake_cli import extras

    declared = _declared()
    defined = {e for es in declared.values() for e in es if e}
    assert set(extras.PREFERENCE) <= defined
    # serving imports torch with the tokenizer and weight loaders: the extra with all of them
    assert extras.extra_for(declared["torch"]) == "models"
    assert extras.extra_for(declared["matplotlib"]) == "plot"
    assert extras.extra_for(declared[extras.distribution_of("mooncake")]) == "upstream"
    assert extras.extra_for(declared["transformers"]) is None  # in `test` alone
