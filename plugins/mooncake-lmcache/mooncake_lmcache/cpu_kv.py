"""A KV connector between LMCache and a plain CPU tensor, for running LMCache without a GPU or a
serving engine (the plugin's tests and bench use it).

The KV cache is one tensor `[2, num_layers, num_tokens, hidden]` (K and V, every layer, every
token of the sequence), the layout of LMCache's KV_2LTD memory objects, passed to
`engine.store(...)` / `engine.retrieve(...)` as `kvcaches=`. Storing copies tokens [start, end)
into each chunk's memory object; retrieving copies them back.
"""

from __future__ import annotations

from typing import Any

import torch
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface


class CpuKVConnector(GPUConnectorInterface):
    """Copies chunks between LMCache memory objects and a `[2, L, T, D]` CPU tensor."""

    def __init__(self, num_layers: int, hidden: int) -> None:
        self.num_layers = num_layers
        self.hidden = hidden
        self.kvcaches: Any = None

    @staticmethod
    def _kv(kwargs: dict[str, Any]) -> torch.Tensor:
        kv = kwargs.get("kvcaches")
        if not isinstance(kv, torch.Tensor) or kv.dim() != 4 or kv.shape[0] != 2:
            raise ValueError("pass kvcaches=, a [2, num_layers, num_tokens, hidden] CPU tensor")
        return kv

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        memory_obj.tensor.copy_(self._kv(kwargs)[:, :, start:end, :])

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        self._kv(kwargs)[:, :, start:end, :].copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs: Any, starts: list[int], ends: list[int],
                         **kwargs: Any) -> None:
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(obj, start, end, **kwargs)

    def batched_to_gpu(self, memory_objs: Any = None, starts: list[int] | None = None,
                       ends: list[int] | None = None, **kwargs: Any) -> None:
        for obj, start, end in zip(memory_objs or [], starts or [], ends or [], strict=True):
            self.to_gpu(obj, start, end, **kwargs)

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, self.num_layers, num_tokens, self.hidden])
