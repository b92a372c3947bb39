"""Plugin discovery over entry points.

Built-in backends register through the same entry points as third-party ones, but the
transfer engine needs the one named tcp (it owns the listener: transfer/endpoints.py), so
MOONCAKE_PLUGINS must keep tcp for any role that starts an engine. A plugin that
fails to import or to construct is reported with its package and error; every other plugin
keeps working. `MOONCAKE_PLUGINS=tcp,shm` restricts which plugins of the groups it names load.
"""

from __future__ import annotations

import importlib.metadata as md
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mooncake_cli.interfaces import PluginError

GROUPS = ("mooncake.transports", "mooncake.tiers")


@dataclass(frozen=True)
class PluginInfo:
    group: str
    name: str
    package: str
    version: str
    available: bool
    reason: str  # why not available, or "" when it is
    loaded: bool  # False when filtered out by MOONCAKE_PLUGINS


def _package_of(ep: md.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is not None:
        return dist.metadata["Name"] or dist.name, dist.version
    return ep.value.split(":")[0].split(".")[0], "unknown"


class Registry:
    """Loads plugins on demand; one instance per process role, passed to whoever needs it."""

    def __init__(
        self,
        entry_points: Iterable[md.EntryPoint] | None = None,
        only: Iterable[str] | None = None,
    ) -> None:
        if entry_points is None:
            entry_points = [ep for g in GROUPS for ep in md.entry_points(group=g)]
        self._eps = list(entry_points)
        self._only = {n.strip() for n in only if n.strip()} if only is not None else None
        self._cache: dict[tuple[str, str], tuple[Any, str]] = {}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Registry:
        env = os.environ if env is None else env
        raw = env.get("MOONCAKE_PLUGINS", "").strip()
        return cls(only=raw.split(",") if raw else None)

    def _selected(self, ep: md.EntryPoint) -> bool:
        """MOONCAKE_PLUGINS restricts only the groups it names a plugin of: `tcp,shm` picks
        transports and leaves tiers alone."""
        if self._only is None:
            return True
        in_group = {e.name for e in self._eps if e.group == ep.group}
        return ep.name in self._only or not (in_group & self._only)

    def _load(self, ep: md.EntryPoint) -> tuple[Any, str]:
        key = (ep.group, ep.name)
        if key not in self._cache:
            pkg, _ = _package_of(ep)
            try:
                obj = ep.load()()
                ok, why = obj.available()
                self._cache[key] = (obj, "" if ok else why)
            except Exception as e:  # a broken plugin must never take the others down
                self._cache[key] = (None, f"{pkg}: failed to load {ep.value}: "
                                          f"{type(e).__name__}: {e}")
        return self._cache[key]

    def plugins(self, group: str | None = None) -> list[PluginInfo]:
        out = []
        for ep in self._eps:
            if group is not None and ep.group != group:
                continue
            pkg, version = _package_of(ep)
            if not self._selected(ep):
                out.append(PluginInfo(ep.group, ep.name, pkg, version, False,
                                      "disabled by MOONCAKE_PLUGINS", False))
                continue
            obj, why = self._load(ep)
            out.append(PluginInfo(ep.group, ep.name, pkg, version,
                                  obj is not None and not why, why, True))
        return sorted(out, key=lambda p: (p.group, p.name))

    def names(self, group: str) -> list[str]:
        return sorted({ep.name for ep in self._eps if ep.group == group})

    def get(self, group: str, name: str) -> Any:
        """The plugin object; PluginError saying why when unknown, filtered, broken or off."""
        eps = [ep for ep in self._eps if ep.group == group and ep.name == name]
        if not eps:
            known = ", ".join(self.names(group)) or "none"
            raise PluginError(f"unknown {group.split('.')[-1][:-1]} '{name}' (known: {known})")
        ep = eps[0]
        if not self._selected(ep):
            raise PluginError(f"plugin '{name}' is disabled by MOONCAKE_PLUGINS")
        obj, why = self._load(ep)
        if obj is None or why:
            raise PluginError(f"plugin '{name}' is not available: {why}")
        return obj

    def available(self, group: str) -> list[Any]:
        return [self.get(group, p.name) for p in self.plugins(group) if p.available]
