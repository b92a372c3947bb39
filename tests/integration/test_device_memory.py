"""Device memory (CUDA tensors) moves through host staging buffers over tcp and shm, and as
VRAM registered with NIXL over nixl (no staging). No GPU exists on the CI machine, so the
device path is driven here with CPU tensors registered through `Segment.register_device` and
the engine's transports (the exact code a CUDA tensor takes, minus the device copy: nixl
registers such a tensor as DRAM); the real CUDA tests are tests/device/test_cuda_memory.py."""

from __future__ import annotations

import pytest

from mooncake_cli.registry import Registry
from mooncake_cli.transfer.batch import Op, State, TransferRequest

torch = pytest.importorskip("torch")
TRANSPORTS = sorted(p.name for p in Registry().plugins("mooncake.transports") if p.available)
MiB = 1 << 20


def staged(engine, tensor):
    """Register `tensor` the way a CUDA tensor is registered (with every transport), and
    publish it."""
    region = engine.segment.register_device(tensor, "cuda:0")
    engine._attach(region)
    return region


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_remote_device_region_round_trip(transport, make_engine) -> None:
    tgt = make_engine()
    tgt.allocate(MiB)  # shm reaches a target with shared memory, and falls back for the rest
    dev = torch.zeros(3 * MiB // 2, dtype=torch.bfloat16)  # 3 MiB: several slices over tcp
    region = staged(tgt, dev)
    assert region.view is None and region.location == "cuda:0"
    eng = make_engine(transport=transport)
    data = torch.randint(0, 256, (3 * MiB,), dtype=torch.uint8)
    src = eng.register(data.clone())
    st = eng.transfer(Op.WRITE, src, 0, tgt.name, region.base, 3 * MiB)
    assert st.state is State.COMPLETED
    assert torch.equal(dev.view(torch.uint8), data)
    back = eng.register(torch.zeros(3 * MiB, dtype=torch.uint8))
    eng.transfer(Op.READ, back, 0, tgt.name, region.base + 5, 3 * MiB - 5)
    assert torch.equal(back.keep[:3 * MiB - 5], data[5:])
    # still bounds-checked like host memory
    [st] = eng.submit([TransferRequest(Op.WRITE, src, 0, tgt.name, region.base + 1,
                                       3 * MiB)]).wait(10)
    assert st.state is State.FAILED and "bounds" in st.reason
    assert torch.equal(dev.view(torch.uint8), data)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_local_device_region_round_trip(transport, make_engine) -> None:
    tgt = make_engine()
    host = tgt.allocate(2 * MiB)
    eng = make_engine(transport=transport)
    data = torch.randint(0, 256, (2 * MiB,), dtype=torch.uint8)
    src = staged(eng, data.clone())
    eng.transfer(Op.WRITE, src, 0, tgt.name, host.base, 2 * MiB)
    assert bytes(host.view) == data.numpy().tobytes()
    dst_t = torch.zeros(2 * MiB, dtype=torch.uint8)
    dst = staged(eng, dst_t)
    eng.transfer(Op.READ, dst, 0, tgt.name, host.base, 2 * MiB)
    assert torch.equal(dst_t, data)
