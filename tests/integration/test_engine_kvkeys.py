"""Block keys: deterministic across processes, chained, namespaced; the block object layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from mooncake_cli.engine import KVCache, ModelRunner, SamplingParams, load_model
from mooncake_cli.kvkeys import (
    KVNamespace,
    block_keys,
    chain_hashes,
    fits,
    model_id_from,
    parse_key,
    reusable_blocks,
)
from mooncake_cli.transfer.segment import host_view

pytestmark = pytest.mark.timeout(60)
NS = KVNamespace("tiny-llama", "float32", 4, 2, 2, 16)
TOKENS = list(range(100, 142))  # 10 full blocks of 4 and a tail of 2


def test_one_key_per_full_block() -> None:
    keys = block_keys(TOKENS, NS)
    assert len(keys) == 10 and len(set(keys)) == 10
    assert block_keys(TOKENS[:3], NS) == []
    assert block_keys(TOKENS[:8], NS) == keys[:2]
    assert keys[0].startswith("kv/tiny-llama/float32/2x2x4x16/")


def test_keys_equal_in_another_process() -> None:
    code = ("import json, sys; from mooncake_cli.kvkeys import KVNamespace, block_keys; "
            "print(json.dumps(block_keys(json.loads(sys.argv[1]), "
            "KVNamespace('tiny-llama', 'float32', 4, 2, 2, 16))))")
    env_seeds = ["0", "12345"]  # string hashing differs per process; keys must not
    for seed in env_seeds:
        out = subprocess.run([sys.executable, "-c", code, json.dumps(TOKENS)], check=True,
                             capture_output=True, text=True,
                             env={**os.environ, "PYTHONHASHSEED": seed},
                             timeout=60).stdout
        assert json.loads(out) == block_keys(TOKENS, NS)


def test_keys_are_chained() -> None:
    keys = block_keys(TOKENS, NS)
    changed = list(TOKENS)
    changed[4 * 3 + 1] += 1  # a token of block 3
    other = block_keys(changed, NS)
    assert other[:3] == keys[:3]
    assert all(a != b for a, b in zip(other[3:], keys[3:], strict=True))


def test_keys_are_namespaced() -> None:
    base = block_keys(TOKENS, NS)
    variants = [KVNamespace("tiny-qwen2", "float32", 4, 2, 2, 16),
                KVNamespace("tiny-llama", "bfloat16", 4, 2, 2, 16),
                KVNamespace("tiny-llama", "float32", 4, 3, 2, 16)]
    for ns in variants:
        keys = block_keys(TOKENS, ns)
        assert all(a != b for a, b in zip(keys, base, strict=True))
        assert {k.rsplit("/", 1)[1] for k in keys}.isdisjoint(k.rsplit("/", 1)[1] for k in base)
        assert not fits(keys[0], NS) and fits(keys[0], ns)


def test_fixed_algorithm_and_byte_order() -> None:
    import xxhash

    h0 = xxhash.xxh3_128_intdigest(NS.tag().encode())
    block = b"".join(t.to_bytes(4, "little") for t in TOKENS[:4])
    assert chain_hashes(TOKENS, NS)[0] == xxhash.xxh3_128_intdigest(h0.to_bytes(16, "big") + block)


def test_parse_key_and_bad_input() -> None:
    key = block_keys(TOKENS, NS)[0]
    assert parse_key(key)[:3] == ("tiny-llama", "float32", (2, 2, 4, 16))
    with pytest.raises(ValueError, match="not a KV block key"):
        parse_key("kv/x/float32/1x2x3/abc")
    with pytest.raises(ValueError, match="model id"):
        KVNamespace("has space", "float32", 4, 2, 2, 16)
    with pytest.raises(ValueError, match="KV dtype"):
        KVNamespace("m", "int4", 4, 2, 2, 16)  # int8 is the int8 wire's (test_kv_int8.py)
    with pytest.raises(ValueError, match=r"\[0, 2\*\*32\)"):
        block_keys([-1, 2, 3, 4], NS)
    assert model_id_from("/models/Qwen2.5 0.5B/") == "Qwen2.5_0.5B"


def test_reusable_blocks_keeps_last_token_to_compute() -> None:
    assert reusable_blocks(42, 4, hits=10) == 10
    assert reusable_blocks(40, 4, hits=10) == 9  # exactly N blocks: the last is recomputed
    assert reusable_blocks(3, 4, hits=0) == 0
    assert reusable_blocks(42, 4, hits=4) == 4


def test_block_object_layout_and_zero_copy_view() -> None:
    model = load_model("demo")
    ns = model.namespace(8)
    cache = KVCache(ns, 16)
    runner = ModelRunner(model, cache)
    seq = runner.new_sequence(model.tokenizer.encode("x" * 20), SamplingParams(max_tokens=1))
    runner.prefill(seq)
    b = seq.block_table[1]
    view = cache.block(b)
    assert view.is_contiguous() and tuple(view.shape) == ns.block_shape
    assert view.numel() * view.element_size() == ns.block_bytes
    k_layer0, v_layer2 = cache.layer(0)[0], cache.layer(2)[1]
    assert torch.equal(view[0, 0], k_layer0[b]) and torch.equal(view[2, 1], v_layer2[b])
    saved = cache.export_block(b)
    dest, _ = host_view(view)  # what StoreClient.get_into writes into: the pool itself
    assert len(dest) == ns.block_bytes
    dest[:] = bytes(ns.block_bytes)
    assert not cache.pool[b].any()
    cache.import_block(b, saved.numpy().tobytes())
    assert torch.equal(cache.pool[b], saved)
    with pytest.raises(ValueError, match="expected"):
        cache.import_block(b, b"\0" * 10)
