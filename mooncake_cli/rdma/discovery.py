"""RDMA devices as the kernel describes them: ports, state, link layer, active MTU, the GID
table (RoCE v1/v2, IPv4-mapped), NUMA node; read from sysfs under a configurable root (a
captured tree in tests, `/` in production), refined by pyverbs when it is importable.

    devices = discover("/")
    gid = recommend_gid(devices[0].ports[0])   # GidChoice(index, reason) or None

There is no RDMA transport of our own: RDMA runs through the nixl plugin, whose UCX picks a GID
and path MTU itself unless UCX_IB_GID_INDEX / UCX_IB_PATH_MTU say otherwise; `mooncake doctor`
compares those with `recommend_gid` and `Port.active_mtu`.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field, replace

IB_MTUS = (256, 512, 1024, 2048, 4096)
ROCE_OVERHEAD = 96  # GRH 40 + UDP 8 + BTH 12 + XRC 4 + AtomicETH 28 + ICRC 4 (kernel iboe_get_mtu)
# UCX's settings (the nixl transport's RDMA path): `auto` / `default` unless set
GID_ENV = "UCX_IB_GID_INDEX"
MTU_ENV = "UCX_IB_PATH_MTU"


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str  # as sysfs writes it: eight groups of four hex digits
    type: str  # "RoCE v1" (sysfs: "IB/RoCE v1"), "RoCE v2", or "IB" on InfiniBand ports
    ndev: str = ""  # the netdev a RoCE GID belongs to

    @property
    def address(self) -> ipaddress.IPv6Address:
        return ipaddress.IPv6Address(self.gid)

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), else None."""
        mapped = self.address.ipv4_mapped
        return str(mapped) if mapped else None

    @property
    def link_local(self) -> bool:
        return self.address.is_link_local


@dataclass(frozen=True)
class Port:
    num: int
    state: str  # ACTIVE, DOWN, INIT, ARMED ...
    phys_state: str  # LinkUp, Disabled, Polling ...
    link_layer: str  # Ethernet (RoCE) or InfiniBand
    active_mtu: int | None  # bytes; None when nothing says
    netdev: str = ""
    netdev_mtu: int | None = None
    rate: str = ""
    gids: tuple[Gid, ...] = ()

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def roce(self) -> bool:
        return self.link_layer == "Ethernet"


@dataclass(frozen=True)
class Device:
    name: str
    numa_node: int | None  # None when the platform does not say (sysfs -1)
    ports: tuple[Port, ...] = ()
    fw_ver: str = ""
    hca_type: str = ""
    max_mr_size: int | None = None  # from pyverbs when importable
    max_qp: int | None = None
    source: str = "sysfs"
    netdevs: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class GidChoice:
    index: int
    reason: str


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def roce_mtu(netdev_mtu: int) -> int | None:
    """The RoCE active MTU the kernel derives from a netdev MTU (largest IB MTU that fits)."""
    fits = [m for m in IB_MTUS if m <= netdev_mtu - ROCE_OVERHEAD]
    return fits[-1] if fits else None


def netdev_for_mtu(ib_mtu: int) -> int:
    """The smallest netdev MTU that gives RoCE active MTU `ib_mtu`."""
    return ib_mtu + ROCE_OVERHEAD


def _state(text: str | None) -> str:
    """sysfs writes "4: ACTIVE": keep the word."""
    return (text or "unknown").split(":", 1)[-1].strip() or "unknown"


def _gids(port_dir: str, link_layer: str) -> tuple[Gid, ...]:
    out = []
    for name in _listdir(os.path.join(port_dir, "gids")):
        raw, idx = _read(os.path.join(port_dir, "gids", name)), _int(name)
        if raw is None or idx is None:
            continue
        try:
            if ipaddress.IPv6Address(raw) == ipaddress.IPv6Address(0):
                continue  # an empty slot of the table
        except ValueError:
            continue
        kind = _read(os.path.join(port_dir, "gid_attrs", "types", name)) or ""
        if link_layer == "InfiniBand":
            kind = "IB"  # sysfs still writes "IB/RoCE v1" on an InfiniBand port
        else:
            kind = "RoCE v2" if "v2" in kind else "RoCE v1" if "v1" in kind else "unknown"
        ndev = _read(os.path.join(port_dir, "gid_attrs", "ndevs", name)) or ""
        out.append(Gid(idx, raw, kind, ndev))
    return tuple(sorted(out, key=lambda g: g.index))


def _port(root: str, dev_dir: str, num: int, netdevs: list[str]) -> Port:
    pdir = os.path.join(dev_dir, "ports", str(num))
    link = _read(os.path.join(pdir, "link_layer")) or "unknown"
    gids = _gids(pdir, link)
    netdev = next((g.ndev for g in gids if g.ndev), "") or (netdevs[0] if netdevs else "")
    ndev_mtu = _int(_read(os.path.join(root, "sys/class/net", netdev, "mtu"))) if netdev else None
    mtu = roce_mtu(ndev_mtu) if link == "Ethernet" and ndev_mtu else None
    return Port(num, _state(_read(os.path.join(pdir, "state"))),
                _state(_read(os.path.join(pdir, "phys_state"))), link, mtu, netdev, ndev_mtu,
                _read(os.path.join(pdir, "rate")) or "", gids)


def from_sysfs(root: str = "/") -> list[Device]:
    """Every device under ROOT/sys/class/infiniband, as sysfs describes it."""
    base = os.path.join(root, "sys/class/infiniband")
    devices = []
    for name in _listdir(base):
        d = os.path.join(base, name)
        netdevs = _listdir(os.path.join(d, "device", "net"))
        numa = _int(_read(os.path.join(d, "device", "numa_node")))
        ports = tuple(_port(root, d, n, netdevs) for n in
                      sorted(p for p in (_int(x) for x in _listdir(os.path.join(d, "ports")))
                             if p is not None))
        devices.append(Device(name, numa if numa is not None and numa >= 0 else None, ports,
                              _read(os.path.join(d, "fw_ver")) or "",
                              _read(os.path.join(d, "hca_type")) or "", netdevs=tuple(netdevs)))
    return devices


def _refine(dev: Device) -> Device:
    """Add what only verbs can tell (IB active MTU, max_mr_size, max_qp); unchanged on error."""
    try:
        from pyverbs.device import Context
    except ImportError:
        return dev
    try:
        with Context(name=dev.name) as ctx:
            attr = ctx.query_device()
            ports = []
            for p in dev.ports:
                mtu = p.active_mtu
                if mtu is None:
                    code = ctx.query_port(p.num).active_mtu  # IBV_MTU_256 = 1 ... 4096 = 5
                    mtu = IB_MTUS[code - 1] if 1 <= code <= len(IB_MTUS) else None
                ports.append(replace(p, active_mtu=mtu))
            return replace(dev, ports=tuple(ports), max_mr_size=int(attr.max_mr_size),
                           max_qp=int(attr.max_qp), source="sysfs+pyverbs")
    except Exception:  # a device that vanished or that verbs cannot open: sysfs still holds
        return dev


def discover(root: str = "/", verbs: bool = True) -> list[Device]:
    """The devices under `root`; with `verbs` (and root `/`) refined through pyverbs."""
    devices = from_sysfs(root)
    if verbs and os.path.realpath(root) == "/":
        devices = [_refine(d) for d in devices]
    return devices


def recommend_gid(port: Port) -> GidChoice | None:
    """The GID index to use on `port` and why; None when the table is empty."""
    if not port.gids:
        return None
    if port.link_layer == "InfiniBand":
        g = port.gids[0]
        return GidChoice(g.index, "InfiniBand routes by LID; GID index 0 is the port GUID's")
    ranked = [
        (lambda g: g.type == "RoCE v2" and g.ipv4 is not None,
         "RoCE v2 with an IPv4-mapped address: routable (UDP/IP) across subnets, what "
         "RDMA CM and most RoCE fabrics use"),
        (lambda g: g.type == "RoCE v2" and not g.link_local,
         "RoCE v2 with a global IPv6 address: routable, but no IPv4 address is on the port"),
        (lambda g: g.type == "RoCE v2",
         "only a link-local RoCE v2 GID: works within one L2 segment only"),
        (lambda g: True,
         "only RoCE v1 GIDs: v1 is not routable and is disabled on many switches"),
    ]
    for match, why in ranked:
        for g in port.gids:
            if match(g):
                return GidChoice(g.index, why)
    return None  # pragma: no cover - the last rule matches any GID
