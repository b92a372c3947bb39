"""nixl checks: the package and its UCX backend, UCX's version, the transports and devices
UCX itself reports (verbs, cuda_ipc, gdr_copy, cma, tcp), whether GPUDirect RDMA can work,
and which transport `auto` will pick for a peer, each with what to fix."""

from __future__ import annotations

import importlib.metadata as md
import os

from mooncake_cli.doctor.check import Check, DoctorConfig, Status, read
from mooncake_cli.registry import Registry

G = "nixl"
INSTALL = "pip install 'mooncake-cli[nixl]' (nixl-cu12; runs beside the CPU build of torch)"


def _version(module: str) -> str:
    try:
        return md.version(module.replace("_", "-"))
    except md.PackageNotFoundError:
        return "unknown"


def package_check(cfg: DoctorConfig) -> tuple[Check, str | None]:
    """The plugin as the registry sees it; the NIXL module name when usable."""
    from mooncake_backends.nixl import ucx

    info = {p.name: p for p in Registry.from_env(cfg.env).plugins("mooncake.transports")}
    p = info.get("nixl")
    if p is None:
        return Check(G, "package", Status.SKIPPED, "no nixl transport plugin is registered",
                     "reinstall mooncake-cli (its entry points name the nixl plugin)"), None
    if not p.loaded:
        return Check(G, "package", Status.SKIPPED, f"nixl plugin {p.reason}",
                     "add nixl to MOONCAKE_PLUGINS to use it", {"loaded": False}), None
    module, why = ucx.find_module()
    if module is None:
        return Check(G, "package", Status.WARN, why, INSTALL, {"installed": False}), None
    version = _version(module)
    if not p.available:
        return Check(G, "package", Status.FAIL, f"{module} {version}: {p.reason}",
                     f"reinstall it: {INSTALL}", {"module": module, "version": version}), None
    return Check(G, "package", Status.OK, f"{module} {version} with its UCX backend plugin",
                 data={"module": module, "version": version}), module


def ptrace_scope(cfg: DoctorConfig) -> int | None:
    raw = (read(cfg.path("proc/sys/kernel/yama/ptrace_scope")) or "").strip()
    return int(raw) if raw.isdigit() else None


def transports_check(info: object, cfg: DoctorConfig) -> list[Check]:
    from mooncake_backends.nixl.ucx import UcxInfo

    assert isinstance(info, UcxInfo)
    if info.error and not info.resources:
        return [Check(G, "UCX", Status.FAIL, f"UCX could not start: {info.error}",
                      "run with UCX_LOG_LEVEL=info to see why; check UCX_TLS / UCX_NET_DEVICES")]
    seen = ", ".join(f"{t}/{d}" for t, d in info.resources)
    out = [Check(G, "UCX", Status.OK, f"UCX {info.version}; components: "
                 f"{', '.join(info.components)}", data={"version": info.version,
                                                       "components": list(info.components)}),
           Check(G, "UCX transports", Status.OK, seen,
                 data={"resources": [list(r) for r in info.resources]})]
    scope = ptrace_scope(cfg)
    if "cma" in info.transports:
        out.append(Check(G, "cma (same host)", Status.OK, "cross-memory attach: same-host "
                         "transfers copy between processes in the kernel"))
    else:
        fix = ("sysctl kernel.yama.ptrace_scope=0 (cma needs ptrace rights between the two "
               "processes)" if scope else "check that the kernel allows process_vm_readv")
        out.append(Check(G, "cma (same host)", Status.WARN, "UCX sees no cma: same-host nixl "
                         "falls back to tcp", fix, {"ptrace_scope": scope}))
    return out


def rdma_check(info: object, cfg: DoctorConfig) -> Check:
    from mooncake_backends.nixl.ucx import UcxInfo

    assert isinstance(info, UcxInfo)
    try:
        devices = sorted(os.listdir(cfg.path("sys/class/infiniband")))
    except OSError:
        devices = []
    if info.rdma:
        return Check(G, "RDMA", Status.OK, f"UCX uses verbs on {', '.join(info.rdma)}: auto "
                     "picks nixl for remote peers", data={"devices": info.rdma})
    if devices:
        return Check(G, "RDMA", Status.FAIL, f"RDMA devices {', '.join(devices)} exist but UCX "
                     "reports no verbs transport", "check `mooncake doctor --group rdma`, the "
                     "rdma-core providers (libmlx5), memlock limits, and that UCX_MODULES / "
                     "UCX_TLS do not exclude ib", {"devices": devices})
    return Check(G, "RDMA", Status.SKIPPED, "no RDMA device: UCX moves bytes with cma on this "
                 "host and tcp between hosts (auto keeps shm/tcp; --transport nixl forces it)")


def gpu_checks(info: object, cfg: DoctorConfig) -> list[Check]:
    from mooncake_backends.nixl.ucx import UcxInfo

    assert isinstance(info, UcxInfo)
    mods = cfg.path("sys/module")
    driver = os.path.isdir(os.path.join(mods, "nvidia"))
    if not driver and not info.cuda:
        return [Check(G, "CUDA", Status.SKIPPED, "no NVIDIA driver: GPU memory cannot be "
                      "registered with NIXL (CUDA tensors are staged through host memory)")]
    out = []
    if info.cuda:
        out.append(Check(G, "CUDA", Status.OK, f"UCX CUDA transports: {', '.join(info.cuda)}",
                         data={"transports": info.cuda}))
    else:
        out.append(Check(G, "CUDA", Status.FAIL, "the NVIDIA driver is loaded but UCX reports "
                         "no cuda_copy/cuda_ipc", "install the CUDA 12 runtime libraries "
                         "(libcudart.so.12) where UCX can load them; check UCX_MODULES"))
    peermem = any(os.path.isdir(os.path.join(mods, m)) for m in ("nvidia_peermem",
                                                                 "nv_peer_mem"))
    if info.rdma and peermem:
        out.append(Check(G, "GPUDirect RDMA", Status.OK, "verbs + nvidia_peermem: the NIC "
                         "reads and writes GPU memory directly"))
    elif info.rdma:
        out.append(Check(G, "GPUDirect RDMA", Status.WARN, "verbs but no nvidia_peermem: GPU "
                         "memory goes through host bounce buffers (or dma-buf with the open "
                         "kernel modules)", "modprobe nvidia_peermem"))
    else:
        out.append(Check(G, "GPUDirect RDMA", Status.SKIPPED, "no RDMA transport: GPU to GPU "
                         "on this host uses cuda_ipc"))
    return out


def checks(cfg: DoctorConfig) -> list[Check]:
    first, module = package_check(cfg)
    if module is None:
        return [first]
    from mooncake_backends.nixl import ucx

    info = ucx.probe(module, timeout=max(cfg.timeout * 4, 10.0))
    out = [first] + transports_check(info, cfg)
    if not info.resources:
        return out
    if os.path.realpath(cfg.root) != "/":  # a captured tree: UCX can only report this host
        why = (f"--sysfs-root {cfg.root} is another host's tree, and UCX reports the machine "
               "it runs on: run doctor on that host")
        return out + [Check(G, "RDMA", Status.SKIPPED, why), Check(G, "CUDA", Status.SKIPPED,
                                                                   why)]
    return out + [rdma_check(info, cfg)] + gpu_checks(info, cfg)
