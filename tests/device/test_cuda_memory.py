"""CUDA tensors through the transfer engine, on a machine with a CUDA device (skipped
elsewhere): over tcp through host staging, and over nixl registered as VRAM, GPU to GPU with no
staging. tests/integration/test_device_memory.py drives the same path with CPU tensors."""

from __future__ import annotations

import pytest

from mooncake_cli.registry import Registry
from mooncake_cli.transfer.batch import Op, State

torch = pytest.importorskip("torch")
TRANSPORTS = sorted(p.name for p in Registry().plugins("mooncake.transports") if p.available)
MiB = 1 << 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_round_trip(make_engine) -> None:  # pragma: no cover - GPU machines only
    tgt = make_engine()
    dev = torch.zeros(MiB, dtype=torch.uint8, device="cuda")
    region = tgt.register(dev)
    assert region.location.startswith("cuda:") and region.view is None
    eng = make_engine(transport="tcp")
    data = torch.randint(0, 256, (MiB,), dtype=torch.uint8)
    src = eng.register(data.clone())
    eng.transfer(Op.WRITE, src, 0, tgt.name, region.base, MiB)
    assert torch.equal(dev.cpu(), data)


@pytest.mark.skipif(not torch.cuda.is_available() or "nixl" not in TRANSPORTS,
                    reason="needs a CUDA device and the nixl transport")
def test_cuda_tensors_move_over_nixl_as_vram(make_engine) -> None:  # pragma: no cover - GPU
    tgt = make_engine()
    dev = torch.zeros(4 * MiB, dtype=torch.uint8, device="cuda")
    region = tgt.register(dev)
    assert region.extra["nixl"].startswith("VRAM:")  # registered as GPU memory, not staged
    eng = make_engine(transport="nixl")
    data = torch.randint(0, 256, (4 * MiB,), dtype=torch.uint8, device="cuda")
    src = eng.register(data)
    assert eng.transfer(Op.WRITE, src, 0, tgt.name, region.base, 4 * MiB).state \
        is State.COMPLETED
    torch.cuda.synchronize()
    assert torch.equal(dev, data)
    back = eng.register(torch.zeros(4 * MiB, dtype=torch.uint8, device="cuda"))
    eng.transfer(Op.READ, back, 0, tgt.name, region.base, 4 * MiB)
    torch.cuda.synchronize()
    assert torch.equal(back.keep, data)
