"""The shm transport into a same-host peer's *private* memory (cross-memory copies, backends/
shm/cma.py): a real target process serving private memory (`transfer serve --private`) is
reached by shm, bytes move both ways and land exactly; the peer's unregistering, its death by
kill -9, a missing secret and an out-of-bounds range each refuse the copy without touching
memory; forced tcp still works."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest
from mooncake_backends.shm.cma import Cma

from mooncake_cli.interfaces import TransferError
from mooncake_cli.transfer.batch import Op
from tests.conftest import Target
from tests.helpers.procs import child_env

pytestmark = pytest.mark.timeout(90)
MiB = 1 << 20


def test_a_private_target_is_reached_by_kernel_copies(
        spawn_target: Callable[..., Target], make_engine: Callable[..., object]) -> None:
    t = spawn_target(4 * MiB, private=True)
    eng = make_engine()
    src = np.frombuffer(os.urandom(3 * MiB), np.uint8).copy()
    region = eng.register(src)  # type: ignore[attr-defined]
    eng.transfer(Op.WRITE, region, 0, t.segment, t.offset + 4096, 3 * MiB)  # type: ignore
    assert eng.transport_for(t.segment) == "shm"  # type: ignore[attr-defined]
    why = eng.transport_choices()[t.segment][1]  # type: ignore[attr-defined]
    assert "private memory (cross-memory copies)" in why
    back = np.zeros(3 * MiB, np.uint8)
    rb = eng.register(back)  # type: ignore[attr-defined]
    eng.transfer(Op.READ, rb, 0, t.segment, t.offset + 4096, 3 * MiB)  # type: ignore
    assert np.array_equal(back, src)
    with pytest.raises(TransferError, match="out of bounds"):
        eng.transfer(Op.WRITE, region, 0, t.segment, t.offset + 4 * MiB - 10, 100)  # type: ignore


def test_the_target_serving_private_memory_needs_the_secret(
        spawn_target: Callable[..., Target], make_engine: Callable[..., object]) -> None:
    t = spawn_target(1 * MiB, private=True, secret="cma-secret")
    eng = make_engine(secret="wrong", transport="shm")
    buf = np.ones(4096, np.uint8)
    region = eng.register(buf)  # type: ignore[attr-defined]
    with pytest.raises(TransferError):
        eng.transfer(Op.WRITE, region, 0, t.segment, t.offset, 4096)  # type: ignore


def test_an_unregistered_region_is_never_written(make_engine: Callable[..., object]) -> None:
    a, b = make_engine(), make_engine()
    dst = np.zeros(MiB, np.uint8)
    region = b.register(dst)  # type: ignore[attr-defined]
    src = np.full(MiB, 5, np.uint8)
    ra = a.register(src)  # type: ignore[attr-defined]
    a.transfer(Op.WRITE, ra, 0, b.name, region.base, 4096)  # type: ignore
    assert (dst[:4096] == 5).all() and a.transport_for(b.name) == "shm"  # type: ignore
    b.unregister(region)  # type: ignore[attr-defined]
    with pytest.raises(TransferError, match="no longer registered|out of bounds"):
        a.transfer(Op.WRITE, ra, 0, b.name, region.base, MiB)  # type: ignore
    assert not dst[4096:].any()


def test_forced_tcp_still_reaches_private_memory(make_engine: Callable[..., object]) -> None:
    a, b = make_engine(transport="tcp"), make_engine(transport="tcp")
    dst = np.zeros(4096, np.uint8)
    region = b.register(dst)  # type: ignore[attr-defined]
    ra = a.register(np.full(4096, 7, np.uint8))  # type: ignore[attr-defined]
    a.transfer(Op.WRITE, ra, 0, b.name, region.base, 4096)  # type: ignore
    assert (dst == 7).all() and a.transport_for(b.name) == "tcp"  # type: ignore


HOLDER = """
import numpy as np, sys
buf = np.zeros(4096, np.uint8)
print(buf.ctypes.data, flush=True)
sys.stdin.readline()
print(buf[:8].tobytes().hex(), flush=True)
sys.stdin.readline()
"""


def test_cma_copies_while_the_peer_lives_and_refuses_once_it_is_gone() -> None:
    p = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=child_env())
    assert p.stdin is not None and p.stdout is not None
    cma = Cma(p.pid, "holder")
    try:
        addr = int(p.stdout.readline())
        cma.write(addr, memoryview(b"mooncake"))
        got = bytearray(8)
        cma.read(addr, memoryview(got))
        p.stdin.write("\n")
        p.stdin.flush()
        assert bytes.fromhex(p.stdout.readline().strip()) == b"mooncake" == bytes(got)
        p.kill()
        p.wait()
        with pytest.raises(TransferError, match="is gone"):
            cma.write(addr, memoryview(b"x"))
    finally:
        cma.close()
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("when", ["at registration", "after a copy"])
def test_a_guarded_region_gets_no_kernel_copies(make_engine: Callable[..., object],
                                                when: str) -> None:
    """A decode worker's KV pool takes writes only with a capability, which the tcp listener
    checks: shm must not copy into it behind the listener's back."""
    a, b = make_engine(), make_engine()
    dst = np.zeros(MiB, np.uint8)
    ra = a.register(np.full(MiB, 9, np.uint8))  # type: ignore[attr-defined]
    if when == "at registration":
        region = b.register(dst, guarded=True)  # type: ignore[attr-defined]
    else:
        region = b.register(dst)  # type: ignore[attr-defined]
        a.transfer(Op.WRITE, ra, 0, b.name, region.base, 4096)  # type: ignore
        assert (dst[:4096] == 9).all()
        b.guard(region)  # type: ignore[attr-defined]
    with pytest.raises(TransferError, match="capability"):
        a.transfer(Op.WRITE, ra, 0, b.name, region.base + 8192, 4096)  # type: ignore
    assert not dst[8192:].any()
    back = np.zeros(4096, np.uint8)  # reads are not guarded
    rb = a.register(back)  # type: ignore[attr-defined]
    a.transfer(Op.READ, rb, 0, b.name, region.base, 4096)  # type: ignore
    assert np.array_equal(back, dst[:4096])
