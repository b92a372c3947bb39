"""LMCache engines on CPU, for the plugin's tests and bench: `LMCacheEngineBuilder`, the
`CpuKVConnector`, and one of three second tiers behind the local CPU cache: this plugin
(`mooncake_config`), LMCache's local-disk backend (`disk_config`) or its redis:// backend
(`redis_config`).

    layout = KVLayout(num_layers=4, num_heads=2, head_size=64)
    engine = build("writer", layout, mooncake_config("127.0.0.1:50051"))
    kv = layout.random(600, seed=1)
    engine.store(tokens, kvcaches=kv)
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import torch
from lmcache.v1.cache_engine import LMCacheEngine, LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata

from mooncake_lmcache.cpu_kv import CpuKVConnector
from mooncake_lmcache.settings import CLASS, MODULE

_ids = itertools.count()


@dataclass(frozen=True)
class KVLayout:
    """The KV geometry of a model: layers, KV heads, head size, dtype, LMCache chunk size."""

    num_layers: int = 16
    num_heads: int = 8
    head_size: int = 64
    dtype: torch.dtype = torch.bfloat16
    chunk_size: int = 256
    model: str = "mooncake-lmcache-test"

    @property
    def hidden(self) -> int:
        return self.num_heads * self.head_size

    def token_bytes(self) -> int:
        return 2 * self.num_layers * self.hidden * self.dtype.itemsize

    def random(self, num_tokens: int, seed: int) -> torch.Tensor:
        """A `[2, L, T, D]` KV cache of random bits (every bit pattern, NaNs included)."""
        g = torch.Generator().manual_seed(seed)
        n = 2 * self.num_layers * num_tokens * self.hidden
        bits = torch.randint(-(1 << 15), 1 << 15, (n,), generator=g, dtype=torch.int16)
        shape = (2, self.num_layers, num_tokens, self.hidden)
        if self.dtype.itemsize == 2:
            return bits.view(self.dtype).view(shape).clone()
        return torch.randn(shape, generator=g).to(self.dtype)

    def empty(self, num_tokens: int) -> torch.Tensor:
        return torch.zeros(2, self.num_layers, num_tokens, self.hidden, dtype=self.dtype)

    def metadata(self) -> LMCacheMetadata:
        return LMCacheMetadata(model_name=self.model, world_size=1, local_world_size=1,
                               worker_id=0, local_worker_id=0, kv_dtype=self.dtype,
                               kv_shape=(self.num_layers, 2, self.chunk_size, self.num_heads,
                                         self.head_size),
                               chunk_size=self.chunk_size)


def mooncake_config(master: str, **settings: Any) -> dict[str, Any]:
    """LMCache settings that put this plugin behind the local CPU cache."""
    extra = {f"remote_storage_plugin.mooncake.{k}": v for k, v in settings.items()}
    extra.update({"remote_storage_plugin.mooncake.module_path": MODULE,
                  "remote_storage_plugin.mooncake.class_name": CLASS,
                  "remote_storage_plugin.mooncake.master": master})
    return {"remote_storage_plugins": ["mooncake"], "extra_config": extra}


def disk_config(path: str, max_gb: float = 2.0) -> dict[str, Any]:
    """LMCache's own local-disk backend behind the local CPU cache."""
    return {"local_disk": f"file://{path}", "max_local_disk_size": max_gb}


def redis_config(url: str) -> dict[str, Any]:
    """LMCache's own redis:// remote backend behind the local CPU cache."""
    return {"remote_url": url, "remote_serde": "naive"}


def build(name: str, layout: KVLayout, tier: dict[str, Any], cpu_gb: float = 1.0,
          **more: Any) -> LMCacheEngine:
    """A post-initialised LMCache engine named `name`-N (N unique in this process)."""
    values: dict[str, Any] = {"chunk_size": layout.chunk_size, "local_cpu": True,
                              "max_local_cpu_size": cpu_gb, "save_unfull_chunk": True,
                              **tier, **more}
    config = LMCacheEngineConfig.from_dict(values)
    engine = LMCacheEngineBuilder.get_or_create(
        f"{name}-{next(_ids)}", config, layout.metadata(),
        CpuKVConnector(layout.num_layers, layout.hidden),
        lambda tensor, src: None, lambda obj, src: obj)
    engine.post_init()
    return engine


def destroy(engine: LMCacheEngine) -> None:
    """Close `engine` (its backends and connectors) and forget it."""
    for key, value in list(LMCacheEngineBuilder._instances.items()):
        if value is engine:
            LMCacheEngineBuilder.destroy(key)
            return
    engine.close()


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 32000, (n,), generator=torch.Generator().manual_seed(seed))


def remote_only(engine: LMCacheEngine, timeout: float = 60.0) -> None:
    """Drop the engine's local CPU copies (once the tier behind has taken them: a chunk still
    being written there cannot be dropped) and keep it from making new ones, so every lookup
    and retrieve goes to the tier behind it."""
    manager = engine.storage_manager
    assert manager is not None and manager.local_cpu_backend is not None
    cpu = manager.local_cpu_backend
    deadline = time.monotonic() + timeout
    while cpu.clear() or cpu.get_keys():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the local CPU cache still holds {len(cpu.get_keys())} chunks "
                               f"after {timeout:g} s")
        time.sleep(0.05)
    engine.set_hot_cache(False)
