"""Install checks: Python, mooncake-cli, its compiled copy, torch (CUDA?), each plugin,
pyverbs (which only lets doctor read more of an RDMA device: transfers never use it)."""

from __future__ import annotations

import importlib
import os
import sys

from mooncake_cli import __version__
from mooncake_cli.doctor.check import Check, DoctorConfig, Status
from mooncake_cli.registry import Registry

G = "install"
MIN_PYTHON = (3, 10)


def python_check(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> Check:
    text = ".".join(map(str, version))
    if tuple(version[:2]) < MIN_PYTHON:
        return Check(G, "python", Status.FAIL, f"Python {text} is older than 3.10",
                     "install Python 3.10 or newer and reinstall mooncake-cli")
    return Check(G, "python", Status.OK, f"Python {text}, mooncake-cli {__version__}",
                 data={"python": text, "mooncake_cli": __version__})


def native_check(streamed: bool | None = None, why: str = "") -> Check:
    """Whether the streamed copy (mooncake_cli/native/streamcopy.c) was built at install:
    without it a store put copies its values by memmove (1.6x slower from 1 MiB on the
    development VM; how much elsewhere depends on the CPU)."""
    if streamed is None:
        try:
            importlib.import_module("mooncake_cli.native.streamcopy")
            streamed = True
        except ImportError as e:
            streamed, why = False, str(e)
    if streamed:
        return Check(G, "streamed copy", Status.OK, "compiled (mooncake_cli.native.streamcopy)",
                     data={"streamed": True})
    return Check(G, "streamed copy", Status.WARN, f"not built ({why}): store puts copy their "
                 "values by memmove, slower for large values (1.6x from 1 MiB on one "
                 "development VM; `mooncake bench store` measures this host)",
                 "install a C compiler and Python's headers (apt install gcc python3-dev), "
                 "then reinstall mooncake-cli", data={"streamed": False})


def torch_check() -> Check:
    try:
        torch = importlib.import_module("torch")
    except ImportError as e:
        return Check(G, "torch", Status.WARN, f"torch is not importable ({e}): tensors cannot "
                      "be registered, only bytes-like buffers", "pip install 'mooncake-cli[torch]'")
    cuda = bool(torch.cuda.is_available())
    n = torch.cuda.device_count() if cuda else 0
    return Check(G, "torch", Status.OK, f"torch {torch.__version__}, "
                 + (f"CUDA {torch.version.cuda} with {n} GPU(s)" if cuda else "CPU only"),
                 data={"version": torch.__version__, "cuda": cuda, "gpus": n})


def plugin_checks(registry: Registry) -> list[Check]:
    out = []
    for p in registry.plugins():
        name = f"plugin {p.name}"
        where = f"{p.group} {p.name} from {p.package} {p.version}"
        data = {"group": p.group, "package": p.package, "version": p.version}
        if not p.loaded:
            out.append(Check(G, name, Status.SKIPPED, f"{where}: {p.reason}",
                             "add it to MOONCAKE_PLUGINS to use it", data))
        elif p.available:
            out.append(Check(G, name, Status.OK, f"{where}: available", data=data))
        elif "failed to load" in p.reason:
            out.append(Check(G, name, Status.FAIL, p.reason,
                             f"reinstall {p.package} (pip install --force-reinstall "
                             f"{p.package}) or uninstall it", data))
        else:
            out.append(Check(G, name, Status.WARN, f"{where}: unavailable: {p.reason}",
                             "only needed if you use this plugin", data))
    return out


def pyverbs_check(cfg: DoctorConfig) -> Check:
    has_devices = bool(os.listdir(cfg.path("sys/class/infiniband"))) \
        if os.path.isdir(cfg.path("sys/class/infiniband")) else False
    try:
        mod = importlib.import_module("pyverbs")
    except ImportError as e:
        if has_devices:
            return Check(G, "pyverbs", Status.SKIPPED, f"pyverbs is not importable ({e}): "
                         "doctor reads the RDMA devices from sysfs alone (no max_mr_size, "
                         "no active MTU where sysfs lacks it); transfers do not need it (RDMA "
                         "goes through the nixl plugin's UCX: see the nixl group)",
                         "optional: apt install python3-pyverbs (rdma-core), or build "
                         "rdma-core with its Python bindings into this environment")
        return Check(G, "pyverbs", Status.SKIPPED, f"pyverbs is not importable ({e}); "
                     "not needed: no RDMA device")
    version = getattr(mod, "__version__", "unknown")
    return Check(G, "pyverbs", Status.OK, f"pyverbs {version} from {mod.__file__}: doctor "
                 "reads RDMA device limits through it", data={"version": version})


def checks(cfg: DoctorConfig) -> list[Check]:
    registry = Registry.from_env(cfg.env)
    return [python_check(), native_check(), torch_check(), *plugin_checks(registry),
            pyverbs_check(cfg)]
