"""What NIXL's bundled UCX can use on this machine: the package, UCX's version, and the
transports and devices UCX itself reports (`ucp_context_print_info`, read in a child process so
a crash in a native library cannot take the caller down).

Shared by the `nixl` transport (its `available()`, its priority, `quiet_ib` before an agent
starts) and `mooncake doctor`.
"""

from __future__ import annotations

import ctypes
import glob
import importlib
import importlib.util
import logging
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from types import ModuleType

MODULES = ("nixl_cu12", "nixl_cu13")  # import names of the wheels `nixl` installs
RDMA_TLS = {"rc_verbs", "rc_mlx5", "dc_mlx5", "ud_verbs", "ud_mlx5", "srd", "rc", "ud", "dc"}
CUDA_TLS = {"cuda_copy", "cuda_ipc", "gdr_copy"}


def find_module() -> tuple[str | None, str]:
    """(import name, "") of the installed NIXL package, or (None, why not)."""
    for name in MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return name, ""
        except (ImportError, ValueError):
            continue
    return None, ("the nixl package is not installed: pip install 'mooncake-cli[nixl]' "
                  "(nixl-cu12)")


def load_api(name: str) -> ModuleType:
    """NIXL's Python API; its logger (INFO lines on stdout, which would break `--json`)
    is routed into ours at WARNING."""
    api = importlib.import_module(f"{name}._api")
    for logger in {logging.getLogger("nixl"), logging.getLogger(name),
                   getattr(api, "logger", logging.getLogger(f"{name}._api"))}:
        logger.handlers.clear()
        logger.propagate = True
        logger.setLevel(logging.WARNING)
    return api


def libs_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        return None
    d = os.path.dirname(os.path.dirname(spec.origin))
    found = glob.glob(os.path.join(d, f"{name}.libs"))
    return found[0] if found else None


def ucx_plugin(name: str) -> tuple[bool, str]:
    """Whether the wheel carries NIXL's UCX backend plugin."""
    libs = libs_dir(name)
    if libs is None:
        return False, f"{name} has no bundled libraries ({name}.libs is missing)"
    if not os.path.exists(os.path.join(libs, "nixl", "libplugin_UCX.so")):
        return False, f"{name} lacks the UCX backend plugin (nixl/libplugin_UCX.so)"
    return True, ""


@dataclass(frozen=True)
class UcxInfo:
    version: str = ""
    components: tuple[str, ...] = ()
    resources: tuple[tuple[str, str], ...] = ()  # (transport, device)
    error: str = ""
    transports: frozenset[str] = field(default_factory=frozenset)

    @property
    def rdma(self) -> list[str]:
        return sorted({d for t, d in self.resources if t in RDMA_TLS})

    @property
    def cuda(self) -> list[str]:
        return sorted({t for t, _ in self.resources if t in CUDA_TLS})


_PROBE = r"""
import ctypes, glob, os, sys
libs = sys.argv[1]
ucp = ctypes.CDLL(glob.glob(os.path.join(libs, "libucp-*"))[0], mode=ctypes.RTLD_GLOBAL)
class P(ctypes.Structure):
    _fields_ = [("field_mask", ctypes.c_uint64), ("features", ctypes.c_uint64),
                ("request_size", ctypes.c_size_t), ("init", ctypes.c_void_p),
                ("cleanup", ctypes.c_void_p), ("tag_sender_mask", ctypes.c_uint64),
                ("mt_workers_shared", ctypes.c_int), ("eps", ctypes.c_size_t),
                ("ppn", ctypes.c_size_t), ("name", ctypes.c_char_p)]
ucp.ucp_get_version_string.restype = ctypes.c_char_p
print("version", ucp.ucp_get_version_string().decode(), flush=True)
maj, mi, rel = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
ucp.ucp_get_version(ctypes.byref(maj), ctypes.byref(mi), ctypes.byref(rel))
cfg, ctx = ctypes.c_void_p(), ctypes.c_void_p()
if ucp.ucp_config_read(None, None, ctypes.byref(cfg)) != 0:
    sys.exit("ucp_config_read failed")
p = P(field_mask=1, features=(1 << 1) | (1 << 5))  # RMA | AM, what NIXL asks for
if ucp.ucp_init_version(maj.value, mi.value, ctypes.byref(p), cfg, ctypes.byref(ctx)) != 0:
    sys.exit("ucp_init failed")
libc = ctypes.CDLL(None)
libc.fdopen.restype = ctypes.c_void_p
f = libc.fdopen(os.dup(1), b"w")
ucp.ucp_context_print_info(ctx, ctypes.c_void_p(f))
libc.fflush(ctypes.c_void_p(f))
os._exit(0)
"""
_RESOURCE = re.compile(r"resource\s+\d+\s*:.*--\s*(\S+?)/(\S+)")
_COMPONENT = re.compile(r"component\s+\d+\s*:\s*(\S+)\s*$")


def probe(name: str, timeout: float = 20.0) -> UcxInfo:
    """Ask the bundled UCX what it sees; `error` says why when it could not."""
    libs = libs_dir(name)
    if libs is None:
        return UcxInfo(error=f"{name}: bundled libraries not found")
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE, libs], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return UcxInfo(error=f"the UCX probe did not finish within {timeout:g} s")
    version, comps, res = "", [], []
    for line in r.stdout.splitlines():
        if line.startswith("version "):
            version = line.split(None, 1)[1].strip()
        elif m := _RESOURCE.search(line):
            res.append((m.group(1), m.group(2)))
        elif m := _COMPONENT.search(line):
            comps.append(m.group(1))
    err = "" if res else (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
    return UcxInfo(version, tuple(comps), tuple(res), err, frozenset(t for t, _ in res))


def fast_paths() -> tuple[list[str], list[str]]:
    """(RDMA devices, CUDA devices) visible without starting UCX: what makes `auto` prefer
    nixl. Cheap enough for every engine: directory listings only."""
    try:
        rdma = sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        rdma = []
    cuda = sorted(os.path.basename(p) for p in glob.glob("/dev/nvidia[0-9]*"))
    return rdma, cuda


def quiet_ib(name: str) -> bool:
    """Where no RDMA device exists, keep the bundled UCX from loading its InfiniBand modules:
    they bring the bundled libnl-route, whose destructor crashes the process at exit
    (nixl-cu12 1.5.1). Set as UCX's own MODULES option in the libucs that the NIXL agent is
    about to start, not as UCX_MODULES in the environment, which is the host's (this runs inside
    vLLM through the plugins); an explicit UCX_MODULES is UCX's to read and is left alone.
    It stays set in a host's process too: UCX loads its modules lazily, so putting the option
    back after the agent starts brings the crash back at the host's exit, and where no RDMA
    device exists the InfiniBand modules have nothing to drive. Whether the option was set."""
    libs = libs_dir(name)
    if "UCX_MODULES" in os.environ or fast_paths()[0] or libs is None:
        return False
    found = glob.glob(os.path.join(libs, "libucs-*.so*"))
    try:  # the same file the agent's UCX plugin links, so the same loaded library
        ucs = ctypes.CDLL(found[0]) if found else None
        return ucs is not None and ucs.ucs_global_opts_set_value(b"MODULES", b"^ib") == 0
    except (OSError, AttributeError):
        return False
