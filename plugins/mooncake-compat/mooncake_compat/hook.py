"""An import hook giving `mooncake`, `mooncake.store` (= mooncake_cli.compat.store) and
`mooncake.engine` (= mooncake_cli.compat.engine) only where no real `mooncake` package is on
sys.path: with upstream's wheel installed, its own modules are imported, never shadowed.

    import mooncake_compat.hook; mooncake_compat.hook.install()   # what the .pth file runs
    from mooncake.store import MooncakeDistributedStore           # ours, or upstream's
    from mooncake.engine import TransferEngine                    # ours, or upstream's
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

TARGETS = {"mooncake.store": "mooncake_cli.compat.store",
           "mooncake.engine": "mooncake_cli.compat.engine"}
NAMES = ("mooncake", *TARGETS)
Finder = Callable[[str, Any], Any]


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if spec.name == "mooncake":
            pkg = types.ModuleType("mooncake", "mooncake-cli's stand-in for upstream Mooncake "
                                               "(mooncake.store and mooncake.engine)")
            pkg.__path__ = []
            return pkg
        return importlib.import_module(TARGETS[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class MooncakeAlias(importlib.abc.MetaPathFinder):
    """Finds `mooncake`, `mooncake.store` and `mooncake.engine` when `find_real` (the path
    finder) finds no real `mooncake`; otherwise stays out of the way."""

    def __init__(self, find_real: Finder = importlib.machinery.PathFinder.find_spec) -> None:
        self.find_real = find_real
        self._real: bool | None = None

    def real(self) -> bool:
        if self._real is None:
            self._real = self.find_real("mooncake", None) is not None
        return self._real

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name not in NAMES or self.real():
            return None
        return importlib.machinery.ModuleSpec(name, _Loader(), is_package=name == "mooncake")


def install(find_real: Finder | None = None) -> MooncakeAlias:
    """Put the alias first on sys.meta_path (once); it defers to a real `mooncake`."""
    for f in sys.meta_path:
        if isinstance(f, MooncakeAlias):
            return f
    alias = MooncakeAlias(find_real or importlib.machinery.PathFinder.find_spec)
    sys.meta_path.insert(0, alias)
    return alias
