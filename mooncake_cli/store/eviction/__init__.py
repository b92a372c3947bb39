"""Eviction: the policies that order a master's objects (lru, lfu, adaptive, arc, prefix, or one a
plugin registers in the `mooncake.eviction_policies` entry-point group) and the victim choice
that applies the rules every policy shares (victims.py).

    policy = make_policy("adaptive")        # a fresh policy for one master
    policy_names()                          # every name make_policy knows
"""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Callable

from mooncake_cli.interfaces import ConfigError, EvictionPolicy
from mooncake_cli.store.eviction.adaptive import AdaptivePolicy
from mooncake_cli.store.eviction.arc import ArcPolicy
from mooncake_cli.store.eviction.lfu import LfuPolicy
from mooncake_cli.store.eviction.lru import LruPolicy
from mooncake_cli.store.eviction.prefix import PrefixPolicy
from mooncake_cli.store.eviction.victims import choose_victims

GROUP = "mooncake.eviction_policies"
DEFAULT = "lru"
BUILTIN: dict[str, Callable[[], EvictionPolicy]] = {
    "lru": LruPolicy, "lfu": LfuPolicy, "adaptive": AdaptivePolicy, "arc": ArcPolicy,
    "prefix": PrefixPolicy}

__all__ = ["BUILTIN", "DEFAULT", "GROUP", "AdaptivePolicy", "ArcPolicy", "LfuPolicy", "LruPolicy",
           "PrefixPolicy", "choose_victims", "make_policy", "policy_names"]


def _entry_points() -> dict[str, md.EntryPoint]:
    return {ep.name: ep for ep in md.entry_points(group=GROUP)}


def policy_names() -> list[str]:
    """The built-in policies and those plugins register, sorted."""
    return sorted({*BUILTIN, *_entry_points()})


def make_policy(name: str) -> EvictionPolicy:
    """A new policy `name` (built-ins first, then the entry-point group); ConfigError saying
    which names exist when unknown, or what went wrong when a plugin's fails to load."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"an eviction policy is a name, not {name!r}")
    factory = BUILTIN.get(name)
    if factory is None:
        ep = _entry_points().get(name)
        if ep is None:
            raise ConfigError(f"unknown eviction policy {name!r} (known: "
                              f"{', '.join(policy_names())})")
        try:
            factory = ep.load()
            policy = factory()
        except Exception as e:  # a broken plugin is reported, never a traceback
            raise ConfigError(f"eviction policy {name!r} ({ep.value}) failed to load: "
                              f"{type(e).__name__}: {e}") from e
    else:
        policy = factory()
    if not isinstance(policy, EvictionPolicy):
        raise ConfigError(f"eviction policy {name!r} does not implement EvictionPolicy "
                          f"(admit, touch, chain, remove, victims and a name)")
    return policy
