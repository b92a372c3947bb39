"""The store benchmark's tensor rows: upstream's tensor API (`put_tensor` / `get_tensor`, and
`batch_put_tensor` / `batch_get_tensor` for a batch) on bf16 CPU tensors of `size` bytes, run the
same way against our compat class and upstream's own (store_workload.py's loop: warm-up, timed
calls, then every tensor read back and compared, the store cleared).

Kept free of engine imports, like store_workload.py (upstream's child runs it too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from mooncake_cli.bench.stats import Progress, Result, summarize, timed_loop

OPS = ("put_tensor", "get_tensor")
BATCHES = (1, 4)  # tensor rows' batches (16 MiB tensors: a batch of 4 is 64 MiB)


class TensorStore(Protocol):
    """upstream's tensor calls, failures raised."""

    def put_tensor(self, key: str, tensor: Any) -> None: ...
    def batch_put_tensor(self, keys: list[str], tensors: list[Any]) -> None: ...
    def get_tensor(self, key: str) -> Any: ...
    def batch_get_tensor(self, keys: list[str]) -> list[Any]: ...
    def clear(self) -> None: ...


def tensors(size: int, n: int) -> list[Any]:
    import torch

    g = torch.Generator().manual_seed(size + n)
    return [torch.randn(max(1, size // 2), generator=g).to(torch.bfloat16) for _ in range(n)]


def verify(store: TensorStore, keys: Sequence[str], expected: Sequence[Any]) -> str:
    import torch

    for key, want in zip(keys, expected, strict=True):
        got = store.get_tensor(key)
        if got is None or got.dtype != want.dtype or not torch.equal(got, want):
            return f"tensor {key!r} read back differs from the one put"
    return ""


def run_tensor_row(store: TensorStore, op: str, size: int, batch: int, duration: float,
                   iterations: int, name: str, via: str, progress: Progress | None = None,
                   label: str = "", prefix: str = "bench") -> Result:
    if op not in OPS:
        raise ValueError(f"unknown tensor op {op!r}")
    label = label or f"{name} {op}"
    vals = tensors(size, batch)
    slots = 4  # batches kept in the store at once (then cleared, untimed)
    pool = [f"{prefix}/{op}-{size}-{batch}/{j}" for j in range(slots * batch)]
    written: list[str] = []

    def put(keys: list[str]) -> None:
        if batch == 1:
            store.put_tensor(keys[0], vals[0])
        else:
            store.batch_put_tensor(keys, vals)

    between = None
    if op == "put_tensor":
        def between(i: int) -> None:
            gen, slot = divmod(i, slots)
            if slot == 0 and gen:
                store.clear()
            written[:] = [f"{k}.{gen}" for k in pool[slot * batch:(slot + 1) * batch]]

        def call(i: int) -> None:
            put(written)
    else:
        keys_of = [pool[j:j + batch] for j in range(0, len(pool), batch)]
        for ks in keys_of:
            put(ks)

        def call(i: int) -> None:
            ks = keys_of[i % slots]
            if batch == 1:
                if store.get_tensor(ks[0]) is None:
                    raise RuntimeError(f"get_tensor {ks[0]!r} found nothing")
            elif any(t is None for t in store.batch_get_tensor(ks)):
                raise RuntimeError("batch_get_tensor missed a tensor")
        written[:] = keys_of[-1]
    timed_loop(call, float("inf"), min(slots, iterations), label, None, between)
    if op == "put_tensor":
        store.clear()
    lats, seconds = timed_loop(call, duration, iterations, label, progress, between)
    why = verify(store, written, vals[:len(written)])
    store.clear()
    calls = len(lats)
    return summarize(name, via, op, size, batch, 1, calls * batch * size, calls * batch,
                     seconds, lats, not why, why)
