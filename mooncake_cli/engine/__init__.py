"""The model engine: checkpoint loading, paged KV cache, our own forward pass, sampling."""

from mooncake_cli.engine.errors import CacheFull, ModelError
from mooncake_cli.engine.kvcache import KVCache
from mooncake_cli.engine.loader import Model, load_model
from mooncake_cli.engine.runner import ModelRunner
from mooncake_cli.engine.sampling import SamplingParams
from mooncake_cli.engine.sequence import Sequence

__all__ = ["CacheFull", "KVCache", "Model", "ModelError", "ModelRunner", "SamplingParams",
           "Sequence", "load_model"]
