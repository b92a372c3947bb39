"""The model engine: checkpoint loading, paged KV cache, our own forward pass, sampling.

Its names load on first use (PEP 562), so that roles which only need `SamplingParams` or the
model catalog (the conductor) do not import torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mooncake_cli.engine.errors import CacheFull, ModelError
    from mooncake_cli.engine.kvcache import KVCache
    from mooncake_cli.engine.loader import Model, load_model
    from mooncake_cli.engine.runner import ModelRunner
    from mooncake_cli.engine.sampling import SamplingParams
    from mooncake_cli.engine.sequence import Sequence

_HOME = {"CacheFull": "errors", "ModelError": "errors", "KVCache": "kvcache", "Model": "loader",
         "load_model": "loader", "ModelRunner": "runner", "SamplingParams": "sampling",
         "Sequence": "sequence"}

__all__ = ["CacheFull", "KVCache", "Model", "ModelError", "ModelRunner", "SamplingParams",
           "Sequence", "load_model"]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
