"""What `bench profile --url` reads from a running vLLM (OpenAI-compatible) server before timing it.

- the model and its longest sequence: GET /v1/models (`id`, `root`, `max_model_len`);
- the version: GET /version (vLLM's; absent on other OpenAI-compatible servers);
- the KV cache: the labels of `vllm:cache_config_info` on GET /metrics (`block_size`,
  `enable_prefix_caching`, `kv_cache_size_tokens`, `kv_cache_memory_bytes`, `cache_dtype`).

KV bytes per token, in this order: `--kv-bytes-per-token`; the server's KV memory over its KV
tokens (vLLM on CPU records both), rounded to a whole number of bytes per element when the
model's config.json can be read (`root` is a local folder); that config's
2 x layers x KV heads x head size x the cache dtype's bytes (`cache_dtype`, or the config's
own dtype when it is "auto"); otherwise a ConfigError asks for the flag.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mooncake_cli.http import jsonhttp
from mooncake_cli.interfaces import ConfigError

TIMEOUT_S = 30.0
DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "fp16": 2, "bf16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}
_INFO = re.compile(r'^vllm:cache_config_info\{(.*)\} ', re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class ServerInfo:
    url: str  # http://HOST:PORT, no trailing slash
    model: str  # the id requests name
    root: str  # where the server loaded it from
    max_model_len: int  # 0: not said
    version: str  # vLLM's, "" when /version does not answer
    cache: dict[str, str]  # the labels of vllm:cache_config_info ({} without them)
    config: dict[str, Any]  # the model's config.json ({} when root is not a local folder)

    @property
    def block_size(self) -> int:
        return _int(self.cache.get("block_size"))

    @property
    def prefix_caching(self) -> bool | None:
        on = self.cache.get("enable_prefix_caching")
        return None if on is None else on == "True"

    @property
    def kv_tokens(self) -> int:
        return _int(self.cache.get("kv_cache_size_tokens"))

    def kv_bytes_per_token(self, given: int) -> tuple[int, str]:
        """(bytes, how they were found): see the module docstring for the order."""
        if given:
            return given, "--kv-bytes-per-token"
        elements = _kv_elements(self.config)
        memory, tokens = _int(self.cache.get("kv_cache_memory_bytes")), self.kv_tokens
        if memory and tokens:
            if elements:
                return elements * max(1, round(memory / tokens / elements)), \
                    "the server's KV memory / KV tokens, whole bytes per element of config.json"
            return memory // tokens, "the server's KV memory / KV tokens"
        dtype = self.cache.get("cache_dtype", "auto")
        if dtype == "auto":
            dtype = str(self.config.get("torch_dtype") or self.config.get("dtype") or "")
        if elements and dtype in DTYPE_BYTES:
            return elements * DTYPE_BYTES[dtype], f"config.json's KV shape in {dtype}"
        raise ConfigError(f"{self.url} does not tell its KV bytes per token (no KV memory in "
                          f"its metrics, no readable config.json at {self.root!r}): give "
                          "--kv-bytes-per-token")


def _int(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() else 0


def _kv_elements(config: dict[str, Any]) -> int:
    """K and V elements one token stores over all layers (0 when config.json does not say)."""
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return 0
    return 2 * layers * kv_heads * head_dim


def _get(url: str) -> jsonhttp.Answer:
    try:
        return jsonhttp.call(url, timeout=TIMEOUT_S)
    except OSError as e:
        raise OSError(f"cannot reach {url}: {str(e).removeprefix(f'{url}: ')}") from None


def read_server(url: str) -> ServerInfo:
    """The facts above; OSError when the URL cannot be reached, ConfigError when it does not
    answer /v1/models as an OpenAI-compatible server."""
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    try:
        jsonhttp.split(base)
    except ValueError as e:
        raise ConfigError(f"--url: {e}") from None
    answer = _get(f"{base}/v1/models")
    data = answer.body.get("data")
    if answer.status != 200 or not isinstance(data, list) or not data \
            or not isinstance(data[0], dict) or not isinstance(data[0].get("id"), str):
        raise ConfigError(f"{base} is not an OpenAI-compatible server: GET /v1/models answered "
                          f"HTTP {answer.status} without a model list")
    entry = data[0]
    version = _get(f"{base}/version")
    metrics = _get(f"{base}/metrics")
    found = _INFO.search(str(metrics.body.get("text", ""))) if metrics.status == 200 else None
    cache = dict(_LABEL.findall(found.group(1))) if found else {}
    root = str(entry.get("root") or entry["id"])
    return ServerInfo(base, entry["id"], root, _int(str(entry.get("max_model_len", ""))),
                      str(version.body.get("version", "")) if version.status == 200 else "",
                      cache, _config(root))


def _config(root: str) -> dict[str, Any]:
    try:
        doc = json.loads((Path(root) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def prefix_hits(url: str) -> float | None:
    """vLLM's `vllm:prefix_cache_hits_total` (tokens), None when its metrics lack it."""
    answer = _get(f"{url}/metrics")
    text = str(answer.body.get("text", "")) if answer.status == 200 else ""
    values = re.findall(r"^vllm:prefix_cache_hits_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    return sum(float(v) for v in values) if values else None
