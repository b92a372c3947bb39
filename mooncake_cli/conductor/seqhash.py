"""The block hashes of the KV indexer API (docs/indexer.md), as upstream
Mooncake's conductor indexer and Dynamo's standalone indexer compute them:

    local[i] = XXH3-64(tokens of block i as little-endian u32, SEED)
    seq[0]   = local[0]
    seq[i]   = XXH3-64(seq[i-1] as 8 bytes LE || local[i] as 8 bytes LE, SEED)

so two prompts share seq[i] exactly when they share their first i+1 blocks. Only whole blocks
have a hash. The spec names the seed without a value; SEED is Dynamo's (1337).
These are not the store's block keys (`mooncake_cli.kvkeys`: XXH3-128, namespaced by model
and geometry): they are what routers written for upstream's API send and expect.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

from mooncake_cli.kvkeys import _token_bytes

SEED = 1337
_PAIR = struct.Struct("<QQ")


def local_hash(tokens: Sequence[int], seed: int = SEED) -> int:
    """XXH3-64 of one block's tokens (ValueError for ids outside [0, 2**32))."""
    return xxhash.xxh3_64_intdigest(_token_bytes(tokens), seed)


def extend(prev: int | None, local: int, seed: int = SEED) -> int:
    """The sequence hash of a block whose local hash is `local` after a block whose sequence
    hash is `prev` (None: the block starts the sequence)."""
    if prev is None:
        return local
    return xxhash.xxh3_64_intdigest(_PAIR.pack(prev, local), seed)


def seq_hashes(tokens: Sequence[int], block_size: int, seed: int = SEED) -> list[int]:
    """seq[0..n-1] for the n = len(tokens) // block_size whole blocks of `tokens`."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, not {block_size}")
    data = _token_bytes(tokens)
    step = block_size * 4
    out: list[int] = []
    prev: int | None = None
    for start in range(0, len(data) - step + 1, step):
        prev = extend(prev, xxhash.xxh3_64_intdigest(data[start:start + step], seed), seed)
        out.append(prev)
    return out
