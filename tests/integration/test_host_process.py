"""A host that loads mooncake as a library (vLLM, LMCache through the plugins) keeps its process
as it was: a store client leaves glibc's allocator to the roles that ask (heap.tune_heap), and
the nixl endpoint leaves the environment alone yet still exits cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.helpers.procs import child_env
from tests.helpers.store_procs import start_master

pytestmark = pytest.mark.timeout(120)

# A 48 MiB malloc is above glibc's largest dynamic mmap threshold (32 MiB), so it is mmapped
# (mallinfo2's hblks counts it) unless mallopt(M_MMAP_THRESHOLD) raised the threshold over it.
_MMAPPED = r"""
import ctypes, json, sys
from mooncake_cli.config import TransferConfig
from mooncake_cli.heap import tune_heap
from mooncake_cli.registry import Registry
from mooncake_cli.store.client import StoreClient
from mooncake_cli.transfer.engine import TransferEngine

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype, libc.malloc.restype = Info, ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[2] == "role":
    tune_heap()
with TransferEngine(TransferConfig(), Registry()) as engine, \
        StoreClient(sys.argv[1], engine, 0, timeout=5):
    before = libc.mallinfo2().hblks
    block = libc.malloc(48 << 20)
    after = libc.mallinfo2().hblks
    libc.free(block)
print(json.dumps({"mmapped": after - before}))
"""


def _glibc_mallinfo2() -> bool:
    import ctypes

    return hasattr(ctypes.CDLL(None), "mallinfo2")


@pytest.mark.skipif(not _glibc_mallinfo2(), reason="glibc >= 2.33 (mallinfo2) only")
@pytest.mark.parametrize(("who", "mmapped"), [("host", 1), ("role", 0)])
def test_a_store_client_leaves_the_hosts_allocator_alone(who: str, mmapped: int) -> None:
    master = start_master(0)
    try:
        r = subprocess.run([sys.executable, "-c", _MMAPPED, master.ready["address"], who],
                           capture_output=True, text=True, timeout=60, cwd=REPO,
                           env=child_env())
        assert r.returncode == 0, r.stderr[-2000:]
        assert json.loads(r.stdout.splitlines()[-1]) == {"mmapped": mmapped}
    finally:
        master.stop()


_NIXL_HOST = r"""
import json, os
from mooncake_cli.config import TransferConfig
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.batch import Op
from mooncake_cli.transfer.engine import TransferEngine

with TransferEngine(TransferConfig(transport="nixl"), Registry()) as a, \
        TransferEngine(TransferConfig(transport="nixl"), Registry()) as b:
    region, data = a.allocate(1 << 20), os.urandom(1 << 20)
    src = b.register(bytearray(data))
    state = b.transfer(Op.WRITE, src, 0, a.name, region.base, 1 << 20).state.name
    print(json.dumps({"state": state, "same": bytes(region.view) == data,
                      "UCX_MODULES": os.environ.get("UCX_MODULES")}), flush=True)
"""


def _nixl() -> None:
    from mooncake_cli.registry import Registry

    nixl = next((p for p in Registry().plugins("mooncake.transports") if p.name == "nixl"), None)
    if nixl is None or not nixl.available:
        pytest.skip(f"nixl unavailable: {nixl and nixl.reason}")


def test_the_nixl_endpoint_leaves_the_environment_and_the_host_exits_cleanly() -> None:
    """Loaded as a library, the nixl transport leaves UCX_MODULES alone, and the host's process
    still exits cleanly after a transfer (without an RDMA device UCX's InfiniBand modules would
    crash it at exit: they stay unloaded through UCX's own option, ucx.quiet_ib)."""
    _nixl()
    env = child_env()
    env.pop("UCX_MODULES", None)
    r = subprocess.run([sys.executable, "-c", _NIXL_HOST], capture_output=True, text=True,
                       timeout=60, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.splitlines()[-1]) == {"state": "COMPLETED", "same": True,
                                                     "UCX_MODULES": None}


def test_a_mooncake_command_over_nixl_exits_cleanly() -> None:
    """A `mooncake` command over nixl exits cleanly too, without an RDMA device."""
    _nixl()
    if os.path.isdir("/sys/class/infiniband"):
        pytest.skip("an RDMA device: UCX keeps its InfiniBand modules")
    env = child_env()
    env.pop("UCX_MODULES", None)
    r = subprocess.run([sys.executable, "-m", "mooncake_cli", "--json", "bench", "transfer",
                        "--transport", "nixl", "--duration", "0.2", "--buffer-size", "1MiB"],
                       capture_output=True, text=True, timeout=90, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    ours = json.loads(r.stdout)["reports"][0]["results"][0]
    assert (ours["name"], ours["transport"], ours["verified"]) == ("ours", "nixl", True)
