"""The plugin's settings, read from LMCache's `extra_config`.

Every key is namespaced by the plugin's name in `remote_storage_plugins` (here `mooncake`):

    remote_storage_plugins: [mooncake]
    extra_config:
      remote_storage_plugin.mooncake.module_path: mooncake_lmcache.connector
      remote_storage_plugin.mooncake.class_name: MooncakeStoreConnector
      remote_storage_plugin.mooncake.master: 127.0.0.1:50051     # or etcd://HOST:PORT/CLUSTER
      remote_storage_plugin.mooncake.replica_num: 2

Keys (all optional but `master`): see `PluginSettings`. Unknown keys are refused by name, so a
typo cannot silently fall back to a default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from mooncake_cli.config import parse_size
from mooncake_cli.interfaces import ConfigError, MooncakeError

MODULE = "mooncake_lmcache.connector"
CLASS = "MooncakeStoreConnector"
PREFIX = "remote_storage_plugin."
_OWN = {"module_path", "class_name"}


@dataclass(frozen=True)
class PluginSettings:
    """What the connector needs: where the store is and how keys are placed."""

    master: str = "127.0.0.1:50051"  # HOST:PORT of the store master, or etcd://... (HA)
    secret: str = ""  # the store's shared secret (default: $MOONCAKE_SECRET)
    segment_size: int = 0  # DRAM this engine contributes to the store (0: none, a pure client)
    replica_num: int = 1  # replicas of every chunk, on distinct segments
    prefer_local: bool = True  # first replica on this engine's own segment when it has one
    soft_pin: bool = False  # chunks evicted only after every unpinned object
    timeout: float = 2.0  # seconds to wait for one answer of the master
    retry_interval: float = 5.0  # seconds a store that failed is answered with misses only
    key_prefix: str = "lmcache/"  # prepended to LMCache's key strings
    host: str = "127.0.0.1"  # transfer-engine listener (loopback unless told otherwise)

    def __post_init__(self) -> None:
        if ":" not in self.master:
            raise ConfigError(f"master must be HOST:PORT or etcd://HOST:PORT, not {self.master!r}")
        if self.segment_size < 0:
            raise ConfigError("segment_size must not be negative")
        if not 1 <= self.replica_num <= 16:
            raise ConfigError(f"replica_num must be in 1..16, got {self.replica_num}")
        if self.timeout <= 0 or self.retry_interval < 0:
            raise ConfigError("timeout must be > 0 and retry_interval >= 0")


class StoreUnreachable(MooncakeError):
    """The store master did not answer when the connector was created."""


def plugin_name(extra: Mapping[str, Any], plugins: list[str] | None) -> str:
    """The name under which LMCache's config loads this connector (its namespace)."""
    ours = [p for p in plugins or []
            if extra.get(f"{PREFIX}{p}.module_path") == MODULE
            and extra.get(f"{PREFIX}{p}.class_name") == CLASS]
    if not ours:
        raise ConfigError(f"no entry of remote_storage_plugins has module_path {MODULE} and "
                          f"class_name {CLASS} in extra_config")
    if len(ours) > 1:
        raise ConfigError(f"remote_storage_plugins loads {CLASS} {len(ours)} times "
                          f"({', '.join(ours)}); one store per engine")
    return ours[0]


def _coerce(name: str, kind: Any, value: Any) -> Any:
    try:
        if name == "segment_size":
            return parse_size(value)
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                return str(value).lower() in ("1", "true", "yes", "on")
            raise ValueError(value)
        if kind == "int":
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if kind == "float":
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {value!r} is not a valid {kind}") from None


def load(extra: Mapping[str, Any] | None, plugins: list[str] | None) -> PluginSettings:
    """The settings under `remote_storage_plugin.<our name>.` in LMCache's extra_config."""
    extra = extra or {}
    ns = f"{PREFIX}{plugin_name(extra, plugins)}."
    known = {f.name: f.type for f in fields(PluginSettings)}
    given: dict[str, Any] = {}
    for key, value in extra.items():
        if not key.startswith(ns) or key[len(ns):] in _OWN:
            continue
        name = key[len(ns):]
        if name not in known:
            raise ConfigError(f"unknown setting {key!r}; known: {', '.join(sorted(known))}")
        given[name] = _coerce(name, known[name], value)
    given.setdefault("secret", os.environ.get("MOONCAKE_SECRET", ""))
    return PluginSettings(**given)
