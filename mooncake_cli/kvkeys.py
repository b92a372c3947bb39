"""KV block keys and the store object layout of one block; shared by conductor, prefill, decode.

Keys. A prompt is cut into full blocks of `block_size` tokens (a partial tail block has no key).
Block i's hash chains over every token before it:

    h_0 = xxh3_128(namespace.tag().encode("utf-8"))
    h_i = xxh3_128(h_{i-1} as 16 big-endian bytes || tokens of block i as little-endian uint32)

so two prompts share key i exactly when they share their first (i+1) blocks. The key is

    kv/<model>/<dtype>/<layers>x<kv_heads>x<block_size>x<head_dim>/<h_i as 32 hex digits>

which names what a reader needs to check that an object fits its cache: the model, the KV dtype
and the geometry. A cluster that moves KV as int8 (`--kv-wire int8`) names its blocks with the
dtype `int8` (see `wire_namespace`): other keys, since the tag starts the hash chain, so an int8
object is never read as a float one, nor the other way round. Python's `hash()` is never used:
keys are equal across processes and hosts.

Object layout. One store object holds all layers' K and V of one block, C-contiguous, in the
KV dtype (native byte order of the writer; every supported host is little-endian):

    [layers, 2 (0 = K, 1 = V), kv_heads, block_size, head_dim]

K is stored after RoPE, as the attention reads it. An `int8` object holds that block quantized
per (layer, K/V, head), as laid out in mooncake_cli/engine/kv_int8.py: the uint8 values in
this shape, then float32 scales and zero points [layers, 2, kv_heads]; any reader dtype
dequantizes it. The paged KV pool of the engine is laid out
as [num_blocks, *this], so one pool block *is* one object: a store get writes straight into it.
"""

from __future__ import annotations

import array
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import xxhash

KEY_PREFIX = "kv"
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}
WIRES = ("native", "int8")
_MODEL_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_U32 = np.dtype("<u4")


@dataclass(frozen=True)
class KVNamespace:
    """What makes a block's KV reusable: the model, the KV dtype and the cache geometry."""

    model: str
    dtype: str
    block_size: int
    layers: int
    kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        if not _MODEL_ID.match(self.model):
            raise ValueError(f"model id {self.model!r}: use 1-128 of A-Z a-z 0-9 . _ - "
                             "(see model_id_from() to derive one from a path)")
        if self.dtype not in _DTYPE_BYTES:
            raise ValueError(f"KV dtype {self.dtype!r}: use one of {', '.join(_DTYPE_BYTES)}")
        for name in ("block_size", "layers", "kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    def tag(self) -> str:
        """`<model>/<dtype>/<layers>x<kv_heads>x<block_size>x<head_dim>`: the key's middle."""
        return (f"{self.model}/{self.dtype}/"
                f"{self.layers}x{self.kv_heads}x{self.block_size}x{self.head_dim}")

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """Shape of one block's store object: [layers, 2, kv_heads, block_size, head_dim]."""
        return (self.layers, 2, self.kv_heads, self.block_size, self.head_dim)

    @property
    def block_bytes(self) -> int:
        """Size in bytes of one block's store object."""
        n = _DTYPE_BYTES[self.dtype]
        for d in self.block_shape:
            n *= d
        if self.dtype == "int8":  # a float32 scale and zero point per (layer, K/V, head)
            n += self.layers * 2 * self.kv_heads * 8
        return n


def wire_namespace(ns: KVNamespace, wire: str) -> KVNamespace:
    """The namespace of the objects a cluster moves and stores: `ns` itself for native, or
    its int8 counterpart (dtype `int8`, same model and geometry)."""
    if wire not in WIRES:
        raise ValueError(f"KV wire {wire!r}: use native or int8")
    return ns if wire == "native" else replace(ns, dtype="int8")


def model_id_from(name: str) -> str:
    """A valid model id from a path or repo name: its last component, other characters -> '_'.

    For a checkpoint directory (one with config.json) or a checkpoint file (a .gguf) the id
    ends in `-<fingerprint>`, so the same checkpoint gets the same id on every host while
    another checkpoint that shares the name (two fine-tunes saved as `final/` or `model.gguf`)
    never shares its KV blocks.
    """
    last = name.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1] or "model"
    base = re.sub(r"[^A-Za-z0-9._-]", "_", last)
    path = Path(name)
    if (path / "config.json").is_file():
        return f"{base[:119]}-{fingerprint(path)}"
    if path.is_file():
        return f"{base[:119]}-{_file_fingerprint(path)}"
    return base[:128]


def _file_fingerprint(f: Path, sample: int = 1 << 20) -> str:
    """8 hex digits of xxh3_64 over a file's size and first and last `sample` bytes."""
    size = f.stat().st_size
    h = xxhash.xxh3_64(str(size).encode())
    with f.open("rb") as fh:
        h.update(fh.read(sample))
        fh.seek(max(0, size - sample))
        h.update(fh.read(sample))
    return h.hexdigest()[:8]


def fingerprint(path: Path, sample: int = 1 << 20) -> str:
    """8 hex digits of xxh3_64 over config.json and, per *.safetensors file, its name, size and
    first and last `sample` bytes (cheap even for large checkpoints)."""
    h = xxhash.xxh3_64((path / "config.json").read_bytes())
    for f in sorted(path.glob("*.safetensors")):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with f.open("rb") as fh:
            h.update(fh.read(sample))
            fh.seek(max(0, size - sample))
            h.update(fh.read(sample))
    return h.hexdigest()[:8]


def _token_bytes(tokens: Sequence[int]) -> bytes:
    if isinstance(tokens, (list, tuple)):  # array's C loop checks each id (3-10x numpy's time)
        try:
            packed = array.array("I", tokens)
        except OverflowError:
            raise ValueError("token ids must be in [0, 2**32)") from None
        except TypeError:
            raise ValueError("token ids must be a flat sequence of integers") from None
        if packed.itemsize == 4:
            if sys.byteorder == "big":
                packed.byteswap()
            return packed.tobytes()
    arr = np.asarray(tokens, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError("token ids must be a flat sequence of integers")
    if arr.size and (arr.min() < 0 or arr.max() > 0xFFFFFFFF):
        raise ValueError("token ids must be in [0, 2**32)")
    return arr.astype(_U32).tobytes()


def chain_hashes(tokens: Sequence[int], ns: KVNamespace, start: int | None = None) -> list[int]:
    """h_1..h_n (128-bit ints), one per full block of `tokens`; see the module docstring.
    `start`: the hash of the block before `tokens` (None: `tokens` begin the sequence)."""
    data = _token_bytes(tokens)
    step = ns.block_size * 4
    h = xxhash.xxh3_128_intdigest(ns.tag().encode("utf-8")) if start is None else start
    out = []
    for start in range(0, len(data) - step + 1, step):
        h = xxhash.xxh3_128_intdigest(h.to_bytes(16, "big") + data[start:start + step])
        out.append(h)
    return out


def key_for(h: int, ns: KVNamespace) -> str:
    return f"{KEY_PREFIX}/{ns.tag()}/{h:032x}"


def block_keys(tokens: Sequence[int], ns: KVNamespace) -> list[str]:
    """One store key per full block of `tokens` (len(tokens) // block_size keys)."""
    prefix = f"{KEY_PREFIX}/{ns.tag()}/"
    return [f"{prefix}{h:032x}" for h in chain_hashes(tokens, ns)]


def parse_key(key: str) -> tuple[str, str, tuple[int, int, int, int], str]:
    """(model, dtype, (layers, kv_heads, block_size, head_dim), hex hash) of a block key."""
    parts = key.split("/")
    if len(parts) != 5 or parts[0] != KEY_PREFIX or not re.fullmatch(r"[0-9a-f]{32}", parts[4]):
        raise ValueError(f"not a KV block key: {key!r}")
    dims = parts[3].split("x")
    if len(dims) != 4 or not all(d.isdigit() for d in dims):
        raise ValueError(f"not a KV block key (bad geometry {parts[3]!r}): {key!r}")
    layers, heads, bs, hd = (int(d) for d in dims)
    return parts[1], parts[2], (layers, heads, bs, hd), parts[4]


def fits(key: str, ns: KVNamespace) -> bool:
    """Whether the object under `key` has the model, dtype and geometry of `ns`."""
    try:
        return key.rsplit("/", 1)[0] == f"{KEY_PREFIX}/{ns.tag()}" and bool(parse_key(key))
    except ValueError:
        return False


def reusable_blocks(num_tokens: int, block_size: int, hits: int) -> int:
    """Leading blocks a prefill may load instead of computing, given `hits` leading store hits.

    At least the last prompt token is always computed (its logits give the first output token),
    so a prompt of exactly N blocks reuses at most N - 1.
    """
    if num_tokens < 1:
        return 0
    return max(0, min(hits, (num_tokens - 1) // block_size))
