"""Private memory: the dram tier's unshared buffers are private mappings (so transparent huge
pages can back them, which makes nixl's cma copies 2-4x faster), and `transfer serve --private`
serves such a buffer, never mapped by a peer: same-host peers copy into it by the kernel (shm's
cross-memory copies), others over tcp (or nixl)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from mooncake_backends.dram import DramTier

from tests.integration.test_cli import Child, _no_mooncake_env, assert_error, mooncake, spawn  # noqa: F401

MiB = 1 << 20


def _mapping(addr: int) -> tuple[str, int]:
    """(permissions, AnonHugePages kB) of the mapping of this process holding `addr`."""
    perms, huge, inside = "", 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                inside = lo <= addr < hi
                if inside:
                    perms = head[1]
            elif inside and head[0] == "AnonHugePages:":
                huge = int(head[1])
    return perms, huge


def test_an_unshared_buffer_is_private_and_may_take_huge_pages() -> None:
    buf = DramTier().allocate(8 * MiB, shared=False)
    try:
        arr = np.frombuffer(buf.view, dtype=np.uint8)
        arr[:] = 1
        perms, huge = _mapping(int(arr.ctypes.data))
        assert perms.endswith("p"), perms  # a shared anonymous mapping would be shmem
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read()
        if "[never]" not in thp:
            assert huge > 0, "madvise(MADV_HUGEPAGE) on a private mapping got no huge page"
        del arr
    finally:
        buf.close()
    shared = DramTier().allocate(MiB, shared=True)
    try:
        assert shared.fd is not None and shared.shm
    finally:
        shared.close()


def test_serve_private_is_reached_by_kernel_copies(spawn: Callable[..., Child],  # noqa: F811
                                                   tmp_path: Path) -> None:
    ready = spawn("--json", "transfer", "serve", "--buffer-size", "1MiB", "--private").json()
    seg, src, out = ready["segment"], tmp_path / "in.bin", tmp_path / "out.bin"
    data = np.random.default_rng(7).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    src.write_bytes(data)
    r = mooncake("--json", "transfer", "write", "--target", seg, str(src))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["transport"] == "shm"  # nothing to map: cross-memory copies
    r = mooncake("transfer", "read", "--target", seg, "--length", str(len(data)), "-o", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == data
    r = mooncake("--json", "transfer", "write", "--target", seg, "--transport", "tcp", str(src))
    assert r.exit_code == 0 and json.loads(r.stdout)["transport"] == "tcp", r.output
