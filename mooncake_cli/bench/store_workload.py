"""The store benchmark's workload, run the same way against our client and upstream's.

A *row* is one (op, value size, batch size): `put` stores fresh keys (batch 1: `put`, else
`batch_put`), `get` reads keys put beforehand (`get` / `batch_get`), `exists` asks for one key.
Every row is warmed up (one pool of keys, untimed), timed for `duration` seconds (or
`iterations` calls, whichever ends first), then verified: the keys it wrote or read are read
back and compared byte for byte with the values put; then the store is cleared. Only the calls
themselves are timed.

Kept free of engine imports: upstream's child process runs it too (store_upstream.py), with an
adapter of the same shape as `Store`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mooncake_cli.bench import store_tensors
from mooncake_cli.bench.stats import Progress, Result, summarize, timed_loop

OPS = ("put", "get", "exists")
POOL_BYTES = 128 << 20  # bytes of live values one row keeps in the store at most


class Store(Protocol):
    """What the workload needs of a store client; failures raise."""

    def put(self, key: str, value: bytes) -> None: ...
    def batch_put(self, keys: list[str], values: list[bytes]) -> None: ...
    def get(self, key: str) -> bytes: ...
    def batch_get(self, keys: list[str]) -> list[bytes]: ...
    def exists(self, key: str) -> bool: ...
    def clear(self) -> None: ...


@dataclass(frozen=True)
class Row:
    op: str
    size: int
    batch: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "size": self.size, "batch": self.batch}


class VerifyFailed(Exception):
    """A value read back differs from the value put."""


def rows(sizes: Sequence[int], batches: Sequence[int]) -> list[Row]:
    """put and get for every size x batch, then exists (4 KiB keys)."""
    out = [Row(op, s, b) for s in sizes for b in batches for op in ("put", "get")]
    return out + [Row("exists", 4096, 1)]


def values(size: int, n: int) -> list[bytes]:
    """`n` distinct random values of `size` bytes."""
    return [os.urandom(size) for _ in range(n)]


def verify(store: Store, keys: Sequence[str], expected: Sequence[bytes]) -> str:
    """'' when every key reads back its expected value, else what differs."""
    for key, want in zip(keys, expected, strict=True):
        got = store.get(key)
        if bytes(got) != want:
            return (f"{key!r} read back {len(got)} bytes that differ from the {len(want)} put"
                    if len(got) == len(want) else
                    f"{key!r} read back {len(got)} bytes, {len(want)} were put")
    return ""


def _pool(row: Row) -> int:
    """Keys per pool: whole batches, at most POOL_BYTES, at least one batch."""
    per = max(1, POOL_BYTES // (row.size * row.batch))
    return min(per, 8) * row.batch


def run_row(store: Store, row: Row, duration: float, iterations: int, name: str, via: str,
            progress: Progress | None = None, label: str = "", prefix: str = "bench") -> Result:
    """Measure `row` on `store`; a Result whose `verified` says whether the bytes matched.
    Tensor rows (store_tensors.py) need `store` to have the tensor calls too."""
    if row.op in store_tensors.OPS:
        return store_tensors.run_tensor_row(store, row.op, row.size, row.batch,  # type: ignore[arg-type]
                                            duration, iterations, name, via, progress, label,
                                            prefix)
    if row.op not in OPS:
        raise ValueError(f"unknown op {row.op!r}")
    label = label or f"{name} {row.op}"
    n = _pool(row)
    vals = values(row.size, row.batch)
    pool = [f"{prefix}/{row.op}-{row.size}-{row.batch}/{j}" for j in range(n)]
    written: list[str] = []

    between = None
    if row.op == "put":
        per = n // row.batch  # batches before the pool is full: then clear it, untimed

        def between(i: int) -> None:
            gen, slot = divmod(i, per)
            if slot == 0 and gen:
                store.clear()
            written[:] = [f"{k}.{gen}" for k in pool[slot * row.batch:(slot + 1) * row.batch]]

        def call(i: int) -> None:
            if row.batch == 1:
                store.put(written[0], vals[0])
            else:
                store.batch_put(written, vals)
    else:
        keys_of = [pool[j:j + row.batch] for j in range(0, n, row.batch)]
        for ks in keys_of:
            store.batch_put(ks, vals) if row.batch > 1 else store.put(ks[0], vals[0])
        if row.op == "exists":
            def call(i: int) -> None:
                if not store.exists(pool[i % n]):
                    raise VerifyFailed(f"{pool[i % n]!r} does not exist")
        elif row.batch == 1:
            def call(i: int) -> None:
                store.get(pool[i % n])
        else:
            def call(i: int) -> None:
                store.batch_get(keys_of[i % len(keys_of)])
        written[:] = keys_of[-1]
    warm = min(n // row.batch, iterations)  # one pool's worth, untimed: caches and pages
    timed_loop(call, float("inf"), warm, label, None, between)
    if row.op == "put":
        store.clear()
    lats, seconds = timed_loop(call, duration, iterations, label, progress, between)
    why = verify(store, written, vals[:len(written)])
    store.clear()
    calls = len(lats)
    moved = 0 if row.op == "exists" else calls * row.batch * row.size
    return summarize(name, via, row.op, row.size, row.batch, 1, moved, calls * row.batch,
                     seconds, lats, not why, why)
