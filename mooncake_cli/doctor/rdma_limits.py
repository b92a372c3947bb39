"""Limits on RDMA registration: memlock vs the planned size, max_mr_size, /dev/infiniband
access, QP/MR usage, GPU peer memory (nvidia_peermem or dma-buf)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess

from mooncake_cli.config import human_size
from mooncake_cli.doctor.check import Check, DoctorConfig, Status, read
from mooncake_cli.rdma.discovery import Device

G = "rdma"
PAGE = 4096


def memlock_check(soft: int, planned: int) -> Check:
    """RDMA pins what it registers: the soft RLIMIT_MEMLOCK must cover the plan."""
    fix = ("raise it: `ulimit -l unlimited`, `* - memlock unlimited` in "
           "/etc/security/limits.conf, LimitMEMLOCK=infinity in a systemd unit, or "
           "`--ulimit memlock=-1` for docker")
    if soft == resource.RLIM_INFINITY:
        return Check(G, "memlock", Status.OK, "RLIMIT_MEMLOCK is unlimited")
    data = {"memlock": soft, "planned": planned}
    if soft < planned:
        return Check(G, "memlock", Status.FAIL, f"RLIMIT_MEMLOCK {human_size(soft)} is below "
                     f"the planned registration of {human_size(planned)}: ibv_reg_mr fails "
                     "with ENOMEM", fix, data)
    return Check(G, "memlock", Status.OK, f"RLIMIT_MEMLOCK {human_size(soft)} covers "
                 f"{human_size(planned)}", data=data)


def _mlx4_max(cfg: DoctorConfig) -> int | None:
    base = cfg.path("sys/module/mlx4_core/parameters")
    mtt, per = read(os.path.join(base, "log_num_mtt")), read(os.path.join(base, "log_mtts_per_seg"))
    try:
        return (1 << int(mtt or "")) * (1 << int(per or "")) * PAGE
    except ValueError:
        return None


def max_mr_check(devices: list[Device], cfg: DoctorConfig) -> Check:
    limits = {d.name: d.max_mr_size for d in devices if d.max_mr_size}
    source = "pyverbs max_mr_size"
    if not limits and (mlx4 := _mlx4_max(cfg)):
        limits = {d.name: mlx4 for d in devices if d.name.startswith("mlx4")}
        source = "mlx4_core log_num_mtt x log_mtts_per_seg x 4 KiB"
    if not limits:
        return Check(G, "max_mr_size", Status.SKIPPED, "not readable: sysfs does not export "
                     "it for this driver", "install pyverbs to read it from the device")
    small = {n: v for n, v in limits.items() if v < cfg.segment_size}
    text = ", ".join(f"{n} {human_size(v)}" for n, v in limits.items())
    if small:
        fix = ("options mlx4_core log_num_mtt=24 log_mtts_per_seg=3 in /etc/modprobe.d/"
               "mlx4.conf, then reload mlx4_core" if "mlx4" in source else
               "register the segment in smaller regions, or use a device with a larger limit")
        return Check(G, "max_mr_size", Status.FAIL, f"{source}: {text}; below the planned "
                     f"{human_size(cfg.segment_size)}", fix, {"max_mr_size": limits})
    return Check(G, "max_mr_size", Status.OK, f"{source}: {text}", data={"max_mr_size": limits})


def dev_check(cfg: DoctorConfig) -> Check:
    base = cfg.path("dev/infiniband")
    nodes = sorted(os.listdir(base)) if os.path.isdir(base) else []
    uverbs = [n for n in nodes if n.startswith("uverbs")]
    if not uverbs:
        return Check(G, "uverbs devices", Status.FAIL, f"no uverbs device in {base}",
                     "modprobe ib_uverbs; in a container pass --device=/dev/infiniband "
                     "(or --privileged)")
    denied = [n for n in uverbs if not os.access(os.path.join(base, n), os.R_OK | os.W_OK)]
    if denied:
        return Check(G, "uverbs devices", Status.FAIL, f"no read/write access to "
                     f"{', '.join(denied)} in {base}", "add the user to the rdma group, or "
                     "chmod 666 /dev/infiniband/uverbs* via a udev rule")
    return Check(G, "uverbs devices", Status.OK, f"{', '.join(uverbs)} readable and writable")


def usage_check(cfg: DoctorConfig) -> Check:
    tool = shutil.which("rdma")
    if os.path.realpath(cfg.root) != "/" or tool is None:
        return Check(G, "QP/MR usage", Status.SKIPPED, "needs the `rdma` tool (iproute2) on "
                     "the live system: usage is reported over netlink, not sysfs")
    try:
        done = subprocess.run([tool, "-j", "res", "show"], capture_output=True, timeout=5,
                              check=True)
        rows = json.loads(done.stdout or b"[]")
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return Check(G, "QP/MR usage", Status.SKIPPED, f"`rdma res show` failed: {e}")
    text = "; ".join(f"{r.get('ifname')}: " + ", ".join(
        f"{k} {v}" for k, v in r.items() if k in ("qp", "mr", "cq", "pd")) for r in rows)
    return Check(G, "QP/MR usage", Status.OK, text or "no resources in use", data={"rows": rows})


def gpu_check(cfg: DoctorConfig) -> Check:
    mods = cfg.path("sys/module")
    if not os.path.isdir(os.path.join(mods, "nvidia")):
        return Check(G, "GPU peer memory", Status.SKIPPED, "no NVIDIA driver loaded: GPU "
                     "buffers are not registered")
    for peer in ("nvidia_peermem", "nv_peer_mem"):
        if os.path.isdir(os.path.join(mods, peer)):
            return Check(G, "GPU peer memory", Status.OK, f"{peer} loaded: GPU memory can be "
                         "registered with the NIC")
    release = (read(cfg.path("proc/sys/kernel/osrelease")) or "").strip()
    try:
        major, minor = (int(x) for x in release.split(".")[:2])
        dmabuf = (major, minor) >= (5, 12)
    except ValueError:
        dmabuf = False
    fix = "modprobe nvidia_peermem (ships with the NVIDIA driver)"
    if dmabuf:
        return Check(G, "GPU peer memory", Status.WARN, f"nvidia_peermem is not loaded; kernel "
                     f"{release} supports dma-buf, which works with the open NVIDIA kernel "
                     "modules only", fix + ", or use the open kernel modules for dma-buf")
    return Check(G, "GPU peer memory", Status.FAIL, f"nvidia_peermem is not loaded and kernel "
                 f"'{release or 'unknown'}' predates dma-buf for RDMA (5.12): registering GPU "
                 "buffers fails", fix)


def checks(devices: list[Device], cfg: DoctorConfig) -> list[Check]:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return [memlock_check(soft, cfg.segment_size), max_mr_check(devices, cfg), dev_check(cfg),
            usage_check(cfg), gpu_check(cfg)]
