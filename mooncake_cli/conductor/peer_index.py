"""The prefix index shared between conductors: what one learns from a prefill answer (the
blocks the instance re-used, stored and, by the index's own LRU, lost) goes to etcd as one
record, and every other conductor applies it to its own CacheIndex.

    body = index_record("prefill-0", touched, stored, evicted)   # one record per answer
    PeerIndex(cluster, lock).apply(body)                        # on the other conductors

A record is bounded: at most `MAX_KEYS` block keys (the leading ones: a prefix match reads
them first), written as their common prefix and each key's rest.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Hashable, Sequence
from typing import Any

from mooncake_cli.scheduler.state import Cluster

MAX_KEYS = 512  # block keys per record (8,192 tokens of 16-token blocks)
PARTS = ("touched", "stored", "evicted")


def index_record(instance: str, touched: Sequence[Hashable], stored: Sequence[Hashable],
                 evicted: Sequence[Hashable] = ()) -> dict[str, Any]:
    """The record of one prefill answer on `instance` (string keys only; others are the
    simulator's and stay local)."""
    room = MAX_KEYS
    parts: dict[str, list[str]] = {}
    for name, keys in (("touched", touched), ("stored", stored), ("evicted", evicted)):
        kept = [k for k in keys if isinstance(k, str)][:room]
        parts[name] = kept
        room -= len(kept)
    every = [k for kept in parts.values() for k in kept]
    common = os.path.commonprefix(every) if every else ""
    return {"instance": instance, "prefix": common,
            **{name: [k[len(common):] for k in kept] for name, kept in parts.items()}}


def parts_of(record: dict[str, Any]) -> dict[str, list[str]]:
    """The full keys of each part of a record; ValueError for a malformed one."""
    common = record.get("prefix")
    if not isinstance(common, str) or not isinstance(record.get("instance"), str):
        raise ValueError("an index record names an instance and a key prefix")
    out = {}
    for name in PARTS:
        rests = record.get(name, [])
        if not isinstance(rests, list) or not all(isinstance(r, str) for r in rests):
            raise ValueError(f"an index record's {name!r} is a list of strings")
        out[name] = [common + r for r in rests]
    if sum(len(v) for v in out.values()) > MAX_KEYS:
        raise ValueError(f"an index record holds at most {MAX_KEYS} keys")
    return out


class PeerIndex:
    """Applies peers' index records to `cluster.index` under `lock`, for prefill instances
    registered here (an instance this conductor does not know is skipped: one that is gone
    would otherwise stay in the index for good)."""

    def __init__(self, cluster: Cluster, lock: threading.RLock) -> None:
        self.cluster = cluster
        self.lock = lock
        self.applied = 0

    def apply(self, record: dict[str, Any]) -> bool:
        """Apply one record; False when its instance is not a prefill instance here."""
        parts = parts_of(record)
        name = record["instance"]
        with self.lock:
            state = self.cluster.by_name.get(name)
            if state is None or state.role != "prefill":
                return False
            index = self.cluster.index
            # re-used blocks are stored, not only touched: a conductor that missed the record
            # that stored them (started later, say) learns them here
            index.store(name, parts["touched"] + parts["stored"])
            index.evict(name, parts["evicted"])
            self.applied += 1
        return True
