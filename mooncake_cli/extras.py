"""The one line that says which extra to install when a command meets a missing optional package.

The extras come from the installed distribution's own metadata, so the line names only extras
that pyproject.toml defines:

    try:
        run_the_command()
    except Exception as e:
        line = missing_line(e)  # "this command needs torch, which is not installed:
                                #  pip install 'mooncake-cli[models]'", or None
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import importlib.util
import re
from collections.abc import Mapping

DIST = "mooncake-cli"
EXIT_CODE = 8  # the exit status of a command stopped by a missing package
OWN = ("mooncake_cli", "mooncake_backends")  # our own modules: missing one is a bug, not an extra
# Which extra to name when several declare the package: the one the commands that import it
# need as a whole (serving needs torch with the tokenizer and weight loaders: `models`, not
# `torch`). Extras not listed follow in the metadata's order; `test` is never named.
PREFERENCE = ("models", "plot", "upstream", "nixl", "torch")
IMPORT_TO_DIST = {"mooncake": "mooncake-transfer-engine-non-cuda"}  # names that differ


def normalize(name: str) -> str:
    """A distribution name as packaging compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(requires: list[str] | None = None) -> dict[str, list[str]]:
    """Normalized distribution -> the extras that declare it ("" for a plain dependency), from
    `requires` (Requires-Dist lines; default: the installed mooncake-cli's)."""
    if requires is None:
        try:
            requires = md.requires(DIST) or []
        except md.PackageNotFoundError:
            requires = []
    out: dict[str, list[str]] = {}
    for req in requires:
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        if name is None:
            continue
        extra = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", req)
        out.setdefault(normalize(name.group(1)), []).append(extra.group(1) if extra else "")
    return out


@functools.lru_cache(maxsize=1)
def _installed() -> Mapping[str, list[str]]:
    return md.packages_distributions()  # every installed distribution's files: read once


def distribution_of(module: str) -> str:
    """The normalized distribution a top-level import name comes from (installed or not)."""
    installed = _installed().get(module)
    return normalize(installed[0] if installed else IMPORT_TO_DIST.get(module, module))


def extra_for(extras: list[str]) -> str | None:
    """The extra to name among those that declare a package; None for `test` alone."""
    usable = [e for e in extras if e and e != "test"]
    ranked = sorted(usable, key=lambda e: PREFERENCE.index(e) if e in PREFERENCE
                    else len(PREFERENCE) + usable.index(e))
    return ranked[0] if ranked else None


def _missing_module(exc: BaseException) -> str | None:
    """The top-level module whose absence raised `exc` (or what caused it); None otherwise."""
    seen: BaseException | None = exc
    for _ in range(4):  # the exception, then what it was raised from
        if seen is None:
            return None
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            top = seen.name.split(".")[0]
            try:  # installed after all: a submodule is missing (a version mismatch)
                return top if importlib.util.find_spec(top) is None else None
            except (ImportError, ValueError):
                return None
        seen = seen.__cause__ or seen.__context__
    return None


def missing_line(exc: BaseException, requires: list[str] | None = None) -> str | None:
    """One line naming what to install when `exc` comes from a package that is declared by
    mooncake-cli (`requires`: default, the installed metadata) but not installed; None for
    anything else (left to the caller's handling)."""
    module = _missing_module(exc)
    if module is None or module in OWN:
        return None
    extras = declared(requires).get(distribution_of(module))
    if not extras:
        return None
    if "" in extras:
        return (f"{module}, a dependency of mooncake-cli, is not installed: reinstall it "
                f"(pip install --force-reinstall {DIST})")
    extra = extra_for(extras)
    if extra is None:
        return None
    return f"this command needs {module}, which is not installed: pip install '{DIST}[{extra}]'"
