"""Shared memory only for peers that proved the secret: a real target process's shm-backed
buffer has no /dev/shm name, its descriptors come only over its authenticated lane, and its
/proc/PID/fd is closed to other processes of the same user."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from mooncake_backends.shm.lane import fetch

from mooncake_cli.config import TransferConfig
from mooncake_cli.interfaces import TransferError
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.batch import Op
from mooncake_cli.transfer.engine import TransferEngine
from tests.conftest import Target, start_target
from tests.helpers.store_procs import REPO

pytestmark = pytest.mark.timeout(60)
SECRET = "shm-secret"
MiB = 1 << 20


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    t = start_target(4 * MiB, secret=SECRET)
    yield t
    t.kill()


@pytest.fixture
def engine() -> Iterator[TransferEngine]:
    eng = TransferEngine(TransferConfig(secret=SECRET, transport="shm"), Registry())
    yield eng
    eng.close()


def test_no_file_names_the_buffer(target: Target) -> None:
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"mooncake-{target.pid}-")]


PROBE = """
import ctypes
from mooncake_cli.config import TransferConfig
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.engine import TransferEngine
libc = ctypes.CDLL(None)
before = libc.prctl(3, 0, 0, 0, 0)
eng = TransferEngine(TransferConfig(secret=SECRET), Registry.from_env())
eng.allocate(1 << 20)
print(before, libc.prctl(3, 0, 0, 0, 0))
eng.close()
"""


@pytest.mark.parametrize("secret", ["'s'", "''"])
def test_an_engine_with_a_secret_closes_its_proc_fd_to_the_same_user(secret: str) -> None:
    """Non-dumpable (PR_GET_DUMPABLE 0): the kernel then gives /proc/PID/fd and /proc/PID/mem
    to root only, and refuses ptrace by the same user: the memfd cannot be taken from there."""
    out = subprocess.run([sys.executable, "-c", PROBE.replace("SECRET", secret)],
                         capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
    assert out.stdout.split() == (["1", "0"] if secret != "''" else ["1", "1"]), out


def test_the_lane_hands_descriptors_only_for_the_secret(target: Target,
                                                        engine: TransferEngine) -> None:
    desc = engine._peer(target.segment).desc
    lane, shm = desc.extra["shm.lane"], desc.regions[0].shm
    assert lane and shm
    with pytest.raises(TransferError, match="requires a shared secret"):
        fetch(lane, shm, None, 5)
    with pytest.raises(TransferError, match="refused our secret"):
        fetch(lane, shm, "wrong", 5)
    fds = fetch(lane, shm, SECRET, 5)
    for fd in fds:
        assert os.fstat(fd).st_size > 0
        os.close(fd)


def test_shm_still_moves_bytes_with_the_secret(target: Target, engine: TransferEngine) -> None:
    src = engine.register(bytearray(b"\x42" * MiB))
    engine.transfer(Op.WRITE, src, 0, target.segment, target.offset, MiB)
    assert engine.transport_for(target.segment) == "shm"
    back = engine.register(bytearray(MiB))
    engine.transfer(Op.READ, back, 0, target.segment, target.offset, MiB)
    assert back.view is not None and bytes(back.view) == b"\x42" * MiB
