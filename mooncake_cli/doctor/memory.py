"""Memory checks: hugepages free vs the planned segment, NUMA layout (and the RDMA devices'
nodes), free RAM; read from proc/meminfo and sys/ under the configured root."""

from __future__ import annotations

import os
import re

from mooncake_cli.config import human_size
from mooncake_cli.doctor.check import Check, DoctorConfig, Status, read
from mooncake_cli.rdma.discovery import from_sysfs

G = "memory"


def meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo (or a node's meminfo) as bytes; HugePages_* counts stay counts."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"(?:Node \d+ )?([\w()]+):\s+(\d+)( kB)?", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * (1024 if m.group(3) else 1)
    return out


def hugepage_pools(cfg: DoctorConfig) -> dict[int, tuple[int, int]]:
    """{page size: (reserved, free)} from sys/kernel/mm/hugepages."""
    base = cfg.path("sys/kernel/mm/hugepages")
    pools = {}
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        m = re.fullmatch(r"hugepages-(\d+)kB", name)
        nr = read(os.path.join(base, name, "nr_hugepages"))
        free = read(os.path.join(base, name, "free_hugepages"))
        if m and nr is not None and free is not None:
            pools[int(m.group(1)) * 1024] = (int(nr), int(free))
    return pools


def hugepage_check(cfg: DoctorConfig, info: dict[str, int]) -> Check:
    pools = hugepage_pools(cfg)
    if not pools and "HugePages_Total" in info:
        pools = {info.get("Hugepagesize", 2 << 20): (info["HugePages_Total"],
                                                    info.get("HugePages_Free", 0))}
    if not pools:
        return Check(G, "hugepages", Status.SKIPPED, "no hugepage information under "
                     f"{cfg.path('sys/kernel/mm/hugepages')} or proc/meminfo")
    free = sum(size * f for size, (_, f) in pools.items())
    text = ", ".join(f"{human_size(size)} pages: {f} of {n} free"
                     for size, (n, f) in pools.items())
    data = {"pools": {str(k): {"reserved": n, "free": f} for k, (n, f) in pools.items()},
            "free_bytes": free, "planned": cfg.segment_size}
    if sum(n for n, _ in pools.values()) == 0:
        return Check(G, "hugepages", Status.OK, f"none reserved ({text}): segments use normal "
                     "pages", data=data)
    if free < cfg.segment_size:
        size = max(s for s, (n, _) in pools.items() if n)
        need = -(-cfg.segment_size // size)
        return Check(G, "hugepages", Status.WARN,
                     f"{text}: {human_size(free)} free is below the planned "
                     f"{human_size(cfg.segment_size)}; the rest comes from normal pages and "
                     "the reserved hugepages sit idle",
                     f"reserve enough: echo {need + pools[size][0] - pools[size][1]} > "
                     f"/sys/kernel/mm/hugepages/hugepages-{size // 1024}kB/nr_hugepages "
                     "(or hugepages= on the kernel command line)", data)
    return Check(G, "hugepages", Status.OK, f"{text}: {human_size(free)} free covers "
                 f"{human_size(cfg.segment_size)}", data=data)


def numa_nodes(cfg: DoctorConfig) -> dict[int, tuple[str, int, int]]:
    """{node: (cpulist, MemTotal, MemFree)} from sys/devices/system/node."""
    base = cfg.path("sys/devices/system/node")
    out = {}
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        m = re.fullmatch(r"node(\d+)", name)
        if m:
            mem = meminfo(read(os.path.join(base, name, "meminfo")) or "")
            out[int(m.group(1))] = ((read(os.path.join(base, name, "cpulist")) or "").strip(),
                                    mem.get("MemTotal", 0), mem.get("MemFree", 0))
    return out


def numa_check(cfg: DoctorConfig) -> Check:
    nodes = numa_nodes(cfg)
    if not nodes:
        return Check(G, "NUMA", Status.SKIPPED, "no NUMA information under "
                     f"{cfg.path('sys/devices/system/node')}")
    text = "; ".join(f"node {n}: cpus {c}, {human_size(f)} free of {human_size(t)}"
                     for n, (c, t, f) in nodes.items())
    devices = [d for d in from_sysfs(cfg.root) if not cfg.device or d.name == cfg.device]
    data = {"nodes": {str(n): {"cpus": c, "total": t, "free": f}
                      for n, (c, t, f) in nodes.items()},
            "devices": {d.name: d.numa_node for d in devices}}
    if len(nodes) > 1:
        unknown = [d.name for d in devices if d.numa_node is None]
        if unknown:
            return Check(G, "NUMA", Status.WARN, f"{text}. {', '.join(unknown)}: NUMA node "
                         "unknown (firmware reports -1)", "pin the engine by hand to the node "
                         "the NIC's PCIe slot hangs off (lstopo shows it)", data)
        short = [(d.name, d.numa_node) for d in devices
                 if d.numa_node in nodes and nodes[d.numa_node][2] < cfg.segment_size]
        if short:
            name, node = short[0]
            return Check(G, "NUMA", Status.WARN, f"{text}. {name} is on node {node}, which has "
                         f"less free memory than the planned {human_size(cfg.segment_size)}",
                         "free memory on that node or shrink --segment-size; memory on the "
                         "other node crosses the socket link on every transfer", data)
        if devices:
            pins = ", ".join(f"{d.name}: numactl --cpunodebind={d.numa_node} "
                             f"--membind={d.numa_node}" for d in devices)
            return Check(G, "NUMA", Status.OK, f"{text}. Run the engine on its NIC's node "
                         f"({pins})", data=data)
    return Check(G, "NUMA", Status.OK, text, data=data)


def ram_check(cfg: DoctorConfig, info: dict[str, int]) -> Check:
    avail = info.get("MemAvailable", info.get("MemFree"))
    if avail is None:
        return Check(G, "free RAM", Status.SKIPPED, f"{cfg.path('proc/meminfo')} not readable")
    data = {"available": avail, "total": info.get("MemTotal"), "planned": cfg.segment_size}
    text = f"{human_size(avail)} available of {human_size(info.get('MemTotal', 0))}"
    if avail < cfg.segment_size:
        return Check(G, "free RAM", Status.FAIL, f"{text}: less than the planned segment of "
                     f"{human_size(cfg.segment_size)}", "lower --segment-size or free memory",
                     data)
    if avail < cfg.segment_size * 5 // 4:
        return Check(G, "free RAM", Status.WARN, f"{text}: the planned segment of "
                     f"{human_size(cfg.segment_size)} leaves under 20% headroom",
                     "lower --segment-size, or expect the OOM killer under load", data)
    return Check(G, "free RAM", Status.OK, f"{text}, segment {human_size(cfg.segment_size)}",
                 data=data)


def checks(cfg: DoctorConfig) -> list[Check]:
    info = meminfo(read(cfg.path("proc/meminfo")) or "")
    return [hugepage_check(cfg, info), numa_check(cfg), ram_check(cfg, info)]
