"""int8 KV blocks: the round trip stays within scale / 2 per element on real smollm2-135m KV,
int8 blocks have their own keys (never read as float ones, nor the other way round), and the
worker setting is checked."""

from __future__ import annotations

import pytest
import torch

from mooncake_cli.config import ConfigError
from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.engine import KVCache, ModelRunner, load_model
from mooncake_cli.engine.kv_int8 import dequantize, error_bound, quantize, wire_bytes
from mooncake_cli.kvkeys import KVNamespace, block_keys, fits, parse_key, wire_namespace
from tests.helpers.smollm import NAME, long_text

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def kv(request: pytest.FixtureRequest) -> tuple[KVNamespace, torch.Tensor]:
    """The 20 whole blocks of a real prompt's KV (smollm2-135m, in the param's dtype)."""
    model = load_model(NAME, dtype=request.param)
    ns = model.namespace(16)
    cache = KVCache(ns, 24)
    runner = ModelRunner(model, cache)
    seq = runner.new_sequence(model.tokenizer.encode(long_text(400, model.tokenizer))[:320])
    runner.step([seq])
    return ns, cache.pool[seq.block_table].clone()


def test_round_trip_within_half_a_scale(kv: tuple[KVNamespace, torch.Tensor]) -> None:
    ns, blocks = kv
    objects = quantize(blocks, ns.block_shape)
    assert objects.dtype == torch.uint8
    assert objects.shape == (len(blocks), wire_bytes(ns.block_shape))
    back = dequantize(objects, ns.block_shape, torch.float32)
    x = blocks.float()
    bound = torch.stack([error_bound(b) for b in blocks])
    err = (back - x).abs()
    # float32 rounding of q * scale + lo adds at most a few ulps of the values
    assert bool((err <= bound + 4 * torch.finfo(torch.float32).eps * x.abs().amax()).all())
    assert float((err / bound.clamp_min(1e-12)).max()) > 0.9, "the bound is reached: a tight one"
    # into the model's dtype: that dtype's own rounding on top
    same = dequantize(objects, ns.block_shape, blocks.dtype)
    assert same.dtype == blocks.dtype
    slack = 4 * torch.finfo(torch.float32).eps * x.abs().amax()
    rounding = torch.finfo(blocks.dtype).eps / 2 * back.abs()  # half an ulp of the result
    assert bool(((same.float() - x).abs() <= bound + rounding + slack).all())


def test_a_constant_group_comes_back_exactly() -> None:
    shape = (2, 2, 3, 4, 8)
    block = torch.randn(shape)
    block[1, 0, 2] = 0.375
    back = dequantize(quantize(block, shape), shape, torch.float32)[0]
    assert torch.equal(back[1, 0, 2], block[1, 0, 2])


def test_object_bytes_and_bad_objects() -> None:
    ns = KVNamespace("smol", "bfloat16", 16, 30, 3, 64)
    wire = wire_namespace(ns, "int8")
    assert wire.block_bytes == wire_bytes(ns.block_shape) == 30 * 2 * 3 * (16 * 64 + 8)
    assert wire.block_bytes < ns.block_bytes * 0.51
    with pytest.raises(ValueError, match="185760 bytes"):
        dequantize(torch.zeros(1000, dtype=torch.uint8), ns.block_shape, torch.float32)


def test_int8_blocks_have_their_own_keys() -> None:
    ns = KVNamespace("smol", "bfloat16", 16, 30, 3, 64)
    wire = wire_namespace(ns, "int8")
    assert wire_namespace(ns, "native") is ns
    tokens = list(range(1000, 1064))
    native, int8 = block_keys(tokens, ns), block_keys(tokens, wire)
    assert len(int8) == 4 and not set(native) & set(int8)
    assert [k.rsplit("/", 1)[1] for k in native] != [k.rsplit("/", 1)[1] for k in int8]
    assert all(fits(k, wire) and not fits(k, ns) for k in int8)
    assert all(fits(k, ns) and not fits(k, wire) for k in native)
    model, dtype, (layers, heads, bs, hd), _ = parse_key(int8[0])
    assert KVNamespace(model, dtype, bs, layers, heads, hd) == wire  # as the conductor reads it
    with pytest.raises(ValueError, match="use native or int8"):
        wire_namespace(ns, "fp8")


def test_worker_setting() -> None:
    assert WorkerConfig().kv_wire == "native"
    assert WorkerConfig(kv_wire="int8").kv_wire == "int8"
    with pytest.raises(ConfigError, match="use native or int8"):
        WorkerConfig(kv_wire="int4")
    with pytest.raises(ConfigError, match="needs our engine"):
        WorkerConfig(kv_wire="int8", engine="vllm")
