"""Device memory over nixl between two processes, next to a device-to-device copy in the same
run: the check a GPU machine runs once.

    python -m mooncake_cli.bench.vram --device cuda --sizes 1MiB,16MiB,256MiB --duration 2

The target is a child process holding one tensor on `--device`, registered with the engine
(a CUDA tensor becomes a VRAM region of NIXL: no host staging); this process registers another
and moves blocks into and out of it over nixl, then copies blocks between two tensors on the
device (`copy_`: cudaMemcpy device to device on CUDA). Each row is verified by a pattern read
back. `--device cpu` runs the same code on host tensors (DRAM), as the tests do.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any

from mooncake_cli.bench.stats import Child, emit
from mooncake_cli.config import TransferConfig, parse_size
from mooncake_cli.interfaces import ConfigError, TransferError
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.batch import Op, State
from mooncake_cli.transfer.engine import TransferEngine


def _tensor(device: str, n: int) -> Any:
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda needs a CUDA device (torch.cuda.is_available())")
    return torch.zeros(n, dtype=torch.uint8, device=device)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def serve(device: str, size: int) -> None:
    with TransferEngine(TransferConfig(), Registry.from_env()) as engine:
        region = engine.register(_tensor(device, size))
        emit({"segment": engine.name, "offset": region.base, "nixl": region.extra.get("nixl")})
        signal.sigwait({signal.SIGTERM, signal.SIGINT})


def _timed(step: Any, device: str, duration: float) -> tuple[int, float]:
    step()
    _sync(device)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < duration:
        step()
        n += 1
    _sync(device)
    return n, time.perf_counter() - t0


def run(device: str, sizes: list[int], duration: float) -> list[dict[str, Any]]:
    big = max(sizes)
    argv = [sys.executable, "-m", "mooncake_cli.bench.vram", "--serve", "--device", device,
            "--sizes", str(big)]
    rows = []
    with Child(argv, f"the {device} target") as child, \
            TransferEngine(TransferConfig(transport="nixl"), Registry.from_env()) as engine:
        info = child.line(timeout=60)
        want = "VRAM" if device.startswith("cuda") else "DRAM"
        if not str(info.get("nixl") or "").startswith(want):
            raise TransferError(f"the target's tensor is not a {want} region of nixl "
                                f"({info.get('nixl')!r}): it would be staged")
        src_t, dst_t = _tensor(device, big), _tensor(device, big)
        src = engine.register(src_t)
        for n in sizes:
            src_t[:n].random_(0, 256)  # verified first: a broken path reports no speed
            engine.transfer(Op.WRITE, src, 0, info["segment"], info["offset"], n)
            keep = src_t[:n].clone()
            src_t[:n].zero_()
            engine.transfer(Op.READ, src, 0, info["segment"], info["offset"], n)
            _sync(device)
            if not bool((src_t[:n] == keep).all()):
                raise TransferError(f"{n} bytes written over nixl did not read back the same")
            for op in (Op.WRITE, Op.READ):
                def step(op: Op = op, n: int = n) -> None:
                    st = engine.transfer(op, src, 0, info["segment"], info["offset"], n)
                    if st.state is not State.COMPLETED:
                        raise TransferError(st.reason)

                count, secs = _timed(step, device, duration)
                rows.append({"row": "nixl", "op": op.value, "bytes": n, "verified": True,
                             "gbps": round(count * n / secs / 1e9, 3)})

            def copy(n: int = n) -> None:
                dst_t[:n].copy_(src_t[:n])

            count, secs = _timed(copy, device, duration)
            rows.append({"row": "device copy", "op": "copy", "bytes": n,
                         "gbps": round(count * n / secs / 1e9, 3)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mooncake_cli.bench.vram")
    p.add_argument("--device", default="cuda")
    p.add_argument("--sizes", default="1MiB,16MiB,256MiB")
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    sizes = [parse_size(s) for s in a.sizes.split(",") if s.strip()]
    if a.serve:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        serve(a.device, max(sizes))
        return 0
    rows = run(a.device, sizes, a.duration)
    copies = {r["bytes"]: r["gbps"] for r in rows if r["row"] == "device copy"}
    for r in rows:
        if r["row"] == "nixl" and copies.get(r["bytes"]):
            r["vs_device_copy"] = round(r["gbps"] / copies[r["bytes"]], 3)
    print(json.dumps({"device": a.device, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
