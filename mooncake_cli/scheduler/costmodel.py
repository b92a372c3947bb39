"""Cost models: how long a prefill, a decode step and a KV transfer take.

A cost model answers five questions the scheduler asks (`CostModel`). Two implementations:

- `AnalyticCostModel`: compute-bound prefill from FLOPs, memory-bound decode from bytes read.
  Prefill of `n` tokens of which the first `p` are cached costs
  `l * (a*(n^2 - p^2)*d + b*(n - p)*d^2)` FLOPs, run at `flops * mfu`; a decode step reads the
  weights once plus the KV of every token in the batch, at `hbm_bandwidth * mbu`.
  `paper()` is the FAST'25 setup: LLaMA3-70B on 8xA800 (l=80, d=8192, a=4, b=22,
  G=8x312 TFLOPS, MFU 0.5), 320 KiB of KV per token, 100 GB/s between instances.
- `FittedCostModel`: the same shapes with coefficients fitted to measurements read from a
  profile file (`load_profile`), as `mooncake bench profile` writes it.

profile.json (schema "mooncake.profile/1"), all times in seconds::

    {
      "schema": "mooncake.profile/1",
      "model": "Qwen2.5-0.5B",               # free text: what was measured
      "device": "cpu",                       # free text
      "block_tokens": 512,                   # tokens per KV block
      "kv_bytes_per_token": 12288,           # KV bytes one token occupies
      "bandwidth_bytes_per_s": 1.0e10,       # KV transfer rate between instances
      "handoff_s_per_token": 2.0e-6,         # optional: a pipeline stage's hand-off (0)
      "prefill": [{"input_tokens": 2048, "cached_tokens": 0, "seconds": 0.41}, ...],
      "decode": [{"batch": 8, "context_tokens": 16384, "seconds": 0.031}, ...]
    }

Prefill samples are fitted to `c0 + c_quad*(n^2 - p^2) + c_lin*(n - p) + c_chunk*chunks` (chunks
= ceil((n - p) / chunk_tokens), when the optional "chunk_tokens" is given: a chunked prefill pays
one forward pass per chunk) and decode samples to `d0 + d_batch*batch + d_ctx*context_tokens`
(least squares of the relative error, negative terms dropped); at least three prefill samples
with distinct lengths and one decode sample are required.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Protocol

from mooncake_cli.interfaces import ConfigError

PROFILE_SCHEMA = "mooncake.profile/1"


class CostModel(Protocol):
    """What the scheduler needs to know about an instance's speed."""

    @property
    def name(self) -> str: ...

    @property
    def block_tokens(self) -> int: ...

    @property
    def kv_bytes_per_token(self) -> int: ...

    @property
    def bandwidth(self) -> float:
        """Bytes per second between two instances."""
        ...

    @property
    def handoff_s_per_token(self) -> float:
        """Seconds a pipeline stage spends handing one token's hidden state to the next."""
        ...

    def prefill_time(self, n: int, p: int = 0) -> float:
        """Seconds to prefill `n` input tokens when the first `p` are cached."""
        ...

    def decode_step_time(self, batch: int, context_tokens: int) -> float:
        """Seconds for one decode step of `batch` requests holding `context_tokens` in all."""
        ...


def transfer_time(model: CostModel, tokens: int, bandwidth: float | None = None) -> float:
    """Seconds to move the KV of `tokens` tokens between two instances, over a link of
    `bandwidth` bytes/s (None: the model's)."""
    return tokens * model.kv_bytes_per_token / (bandwidth or model.bandwidth) if tokens > 0 else 0.0


@dataclass(frozen=True)
class AnalyticCostModel:
    """FLOPs-bound prefill and bandwidth-bound decode of a dense transformer."""

    name: str = "analytic"
    layers: int = 80
    hidden: int = 8192
    attn_coeff: float = 4.0  # a: attention FLOPs per (token pair, hidden unit, layer)
    linear_coeff: float = 22.0  # b: linear FLOPs per (token, hidden^2, layer)
    flops: float = 8 * 312e12  # peak FLOP/s of one instance
    mfu: float = 0.5
    weight_bytes: float = 140e9  # read once per decode step
    hbm_bandwidth: float = 8 * 2.0e12  # bytes/s of one instance
    mbu: float = 0.5
    kv_bytes_per_token: int = 320 * 1024
    bandwidth: float = 100e9
    block_tokens: int = 512
    activation_bytes: int = 2  # per hidden unit handed between pipeline stages (bf16)

    @property
    def handoff_s_per_token(self) -> float:
        return self.hidden * self.activation_bytes / self.bandwidth

    def __post_init__(self) -> None:
        if min(self.layers, self.hidden, self.block_tokens, self.kv_bytes_per_token) < 1:
            raise ConfigError("layers, hidden, block_tokens and kv_bytes_per_token must be >= 1")
        if not (0 < self.mfu <= 1 and 0 < self.mbu <= 1):
            raise ConfigError(f"mfu ({self.mfu}) and mbu ({self.mbu}) must be in (0, 1]")
        if min(self.flops, self.hbm_bandwidth, self.bandwidth) <= 0:
            raise ConfigError("flops, hbm_bandwidth and bandwidth must be > 0")

    def prefill_time(self, n: int, p: int = 0) -> float:
        p = min(max(p, 0), n)
        d = self.hidden
        work = self.layers * (self.attn_coeff * (n * n - p * p) * d
                              + self.linear_coeff * (n - p) * d * d)
        return work / (self.flops * self.mfu)

    def decode_step_time(self, batch: int, context_tokens: int) -> float:
        if batch <= 0:
            return 0.0
        moved = self.weight_bytes + context_tokens * self.kv_bytes_per_token
        return moved / (self.hbm_bandwidth * self.mbu)


def paper() -> AnalyticCostModel:
    """LLaMA3-70B on 8xA800 at MFU 0.5, 320 KiB KV per token, 100 GB/s (FAST'25 setup)."""
    return AnalyticCostModel(name="paper: LLaMA3-70B on 8xA800, MFU 0.5")


@dataclass(frozen=True)
class FittedCostModel:
    """Coefficients fitted to measured prefill and decode times (see module docstring)."""

    name: str
    block_tokens: int
    kv_bytes_per_token: int
    bandwidth: float
    c0: float
    c_quad: float
    c_lin: float
    d0: float
    d_batch: float
    d_ctx: float
    c_chunk: float = 0.0  # per prefill chunk (a forward pass), when chunk_tokens is known
    chunk_tokens: int = 0
    handoff_s_per_token: float = 0.0  # measured, when the profile has it

    def prefill_time(self, n: int, p: int = 0) -> float:
        p = min(max(p, 0), n)
        if n == p:
            return 0.0
        return self.c0 + self.c_quad * (n * n - p * p) + self.c_lin * (n - p) + \
            self.c_chunk * _chunks(n - p, self.chunk_tokens)

    def decode_step_time(self, batch: int, context_tokens: int) -> float:
        if batch <= 0:
            return 0.0
        return self.d0 + self.d_batch * batch + self.d_ctx * context_tokens


def _chunks(tokens: int, chunk: int) -> int:
    return -(-tokens // chunk) if chunk > 0 else 0


def fit_nonnegative(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Non-negative least squares of the relative error (each row weighted by 1/y, so short
    and long samples count alike), dropping negative terms until none is left."""
    import numpy as np

    w = np.array([1.0 / y if y > 0 else 1.0 for y in ys])
    active = list(range(len(rows[0])))
    while active:
        a = np.array([[r[i] for i in active] for r in rows], dtype=float) * w[:, None]
        sol, *_ = np.linalg.lstsq(a, np.array(ys, dtype=float) * w, rcond=None)
        if (sol >= 0).all():
            out = [0.0] * len(rows[0])
            for i, v in zip(active, sol, strict=True):
                out[i] = float(v)
            return out
        active.pop(int(np.argmin(sol)))
    return [0.0] * len(rows[0])


def _field(doc: dict[str, Any], key: str, path: str, kind: type = float) -> Any:
    if key not in doc:
        raise ConfigError(f"{path}: missing '{key}' (see `mooncake bench trace --help`)")
    try:
        value = kind(doc[key])
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: '{key}' must be a number, not {doc[key]!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{path}: '{key}' must be a finite number >= 0, not {doc[key]!r}")
    return value


def profile_model(doc: dict[str, Any], path: str = "profile") -> FittedCostModel:
    """A fitted model from a parsed profile document; ConfigError says what is wrong."""
    if doc.get("schema") != PROFILE_SCHEMA:
        raise ConfigError(f"{path}: 'schema' must be \"{PROFILE_SCHEMA}\", "
                          f"not {doc.get('schema')!r}")
    prefill, decode = doc.get("prefill"), doc.get("decode")
    if not isinstance(prefill, list) or not isinstance(decode, list) or not decode:
        raise ConfigError(f"{path}: needs lists 'prefill' and 'decode' of samples")
    chunk = int(_field(doc, "chunk_tokens", path, int)) if "chunk_tokens" in doc else 0
    p_rows, p_ys = [], []
    for i, s in enumerate(prefill):
        where = f"{path}: prefill[{i}]"
        n, p = _field(s, "input_tokens", where, int), _field(s, "cached_tokens", where, int)
        if p > n:
            raise ConfigError(f"{where}: cached_tokens {p} exceeds input_tokens {n}")
        p_rows.append([1.0, float(n * n - p * p), float(n - p), float(_chunks(n - p, chunk))])
        p_ys.append(_field(s, "seconds", where))
    if len({r[2] for r in p_rows}) < 3:
        raise ConfigError(f"{path}: need prefill samples of at least 3 distinct uncached lengths")
    d_rows, d_ys = [], []
    for i, s in enumerate(decode):
        where = f"{path}: decode[{i}]"
        d_rows.append([1.0, float(_field(s, "batch", where, int)),
                       float(_field(s, "context_tokens", where, int))])
        d_ys.append(_field(s, "seconds", where))
    c0, cq, cl, cc = fit_nonnegative(p_rows, p_ys)
    d0, db, dc = fit_nonnegative(d_rows, d_ys)
    block = _field(doc, "block_tokens", path, int)
    kv = _field(doc, "kv_bytes_per_token", path, int)
    bw = _field(doc, "bandwidth_bytes_per_s", path)
    if block < 1 or kv < 1 or bw <= 0:
        raise ConfigError(f"{path}: block_tokens, kv_bytes_per_token and "
                          "bandwidth_bytes_per_s must be > 0")
    handoff = _field(doc, "handoff_s_per_token", path) if "handoff_s_per_token" in doc else 0.0
    name = f"profile: {doc.get('model', '?')} on {doc.get('device', '?')}"
    return FittedCostModel(name, block, kv, bw, c0, cq, cl, d0, db, dc, cc, chunk, handoff)


def load_profile(path: str) -> FittedCostModel:
    """Read and fit a profile.json; ConfigError names the file and the problem."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"profile {path} does not exist (write one with "
                          "`mooncake bench profile`)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"profile {path} is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(f"profile {path} must hold a JSON object")
    return profile_model(doc, path)
