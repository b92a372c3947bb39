"""RDMA checks per device and port: state, link layer, active MTU (vs the peer's), the GID to
use and why; then memlock vs the planned registration, max_mr_size, /dev/infiniband access,
QP/MR usage and GPU peer memory (doctor/rdma_limits.py).

RDMA transfers run through the nixl plugin's UCX, so the settings named in fixes are UCX's
(UCX_IB_GID_INDEX, UCX_IB_PATH_MTU); the `nixl` group checks that UCX sees the devices."""

from __future__ import annotations

from typing import Any

from mooncake_cli.doctor import rdma_limits
from mooncake_cli.doctor.check import Check, DoctorConfig, Status
from mooncake_cli.rdma.discovery import (
    GID_ENV,
    MTU_ENV,
    Device,
    Port,
    discover,
    netdev_for_mtu,
    recommend_gid,
)

G = "rdma"


def state_check(dev: Device, port: Port) -> Check:
    name = f"{dev.name}/{port.num} state"
    what = (f"{port.state} ({port.phys_state}), {port.link_layer}"
            + (f" on {port.netdev}" if port.netdev else "") + (f", {port.rate}" if port.rate
                                                                 else ""))
    data = {"state": port.state, "phys_state": port.phys_state, "link_layer": port.link_layer,
            "netdev": port.netdev, "numa_node": dev.numa_node}
    if port.active:
        return Check(G, name, Status.OK, what, data=data)
    if port.phys_state in ("Disabled", "Sleep"):
        fix = (f"bring the link up: ip link set dev {port.netdev} up" if port.netdev else
               "enable the port (ibportstate / the switch)")
    elif port.phys_state == "Polling":
        fix = "no link partner: check the cable, transceiver and switch port"
    elif port.state in ("INIT", "ARMED"):
        fix = "link is up but not active: on InfiniBand start a subnet manager (opensm)"
    else:
        fix = "check `ibv_devinfo -d " + dev.name + "` and the cabling"
    return Check(G, name, Status.FAIL, what, fix, data)


def mtu_check(dev: Device, port: Port, peer_mtu: int) -> Check:
    name = f"{dev.name}/{port.num} MTU"
    mtu = port.active_mtu
    data = {"active_mtu": mtu, "netdev_mtu": port.netdev_mtu, "peer_mtu": peer_mtu or None}
    if mtu is None:
        return Check(G, name, Status.SKIPPED, "active MTU not readable from sysfs "
                     f"({port.link_layer}); pyverbs reports it", "install pyverbs", data)
    via = f" (netdev {port.netdev} MTU {port.netdev_mtu})" if port.netdev_mtu else ""
    if peer_mtu and peer_mtu != mtu:
        low = min(mtu, peer_mtu)
        raise_it = (f"raise the smaller side: ip link set dev {port.netdev} mtu "
                    f"{netdev_for_mtu(peer_mtu)} or more" if port.roce and mtu < peer_mtu
                    else "raise the peer's netdev MTU")
        return Check(G, name, Status.FAIL, f"active MTU {mtu}{via}, the peer's {peer_mtu}: "
                     "queue pairs between them fail or fall back to the smaller one",
                     f"{raise_it}, or set {MTU_ENV}={low} on both sides (UCX, for the nixl "
                     "transport)", data)
    if mtu < 4096 and port.roce:
        return Check(G, name, Status.WARN, f"active MTU {mtu}{via}: RoCE runs at 4096 with "
                     "jumbo frames", f"ip link set dev {port.netdev} mtu 9000 on every host "
                     "and switch port (or keep it and match it everywhere)", data)
    return Check(G, name, Status.OK, f"active MTU {mtu}{via}"
                 + (", same as the peer's" if peer_mtu else ""), data=data)


def gid_check(dev: Device, port: Port, env_index: str | None) -> Check:
    name = f"{dev.name}/{port.num} GID"
    table = [f"{g.index} {g.type} {g.ipv4 or g.address.compressed}"
             + (f" ({g.ndev})" if g.ndev else "") for g in port.gids]
    data: dict[str, Any] = {"gids": [{"index": g.index, "gid": g.gid, "type": g.type,
                                      "ipv4": g.ipv4, "ndev": g.ndev} for g in port.gids]}
    choice = recommend_gid(port)
    if choice is None:
        return Check(G, name, Status.FAIL, "the GID table is empty",
                     f"the port has no address: bring {port.netdev or 'its netdev'} up and "
                     "give it an IP address", data)
    data["recommended"] = choice.index
    chosen = next(g for g in port.gids if g.index == choice.index)
    best = port.link_layer == "InfiniBand" or (chosen.type == "RoCE v2" and chosen.ipv4)
    evidence = f"use GID index {choice.index}: {choice.reason}. Table: " + "; ".join(table)
    pin = f"{GID_ENV}={choice.index} pins it for UCX (the nixl transport; default: auto)"
    if env_index is not None and env_index.strip() not in (str(choice.index), "auto"):
        return Check(G, name, Status.WARN, f"{GID_ENV}={env_index} is set, but {evidence}",
                     f"export {GID_ENV}={choice.index} (or unset it: UCX then picks)", data)
    if best:
        return Check(G, name, Status.OK, evidence, pin, data)
    return Check(G, name, Status.WARN, evidence,
                 f"give {port.netdev or 'the netdev'} an IPv4 address (ip addr add IP/LEN dev "
                 f"{port.netdev or 'DEV'}) so a RoCE v2 IPv4-mapped GID appears; meanwhile "
                 f"{pin}", data)


def device_checks(dev: Device, cfg: DoctorConfig) -> list[Check]:
    out = []
    for port in dev.ports:
        out.append(state_check(dev, port))
        if port.active:
            out += [mtu_check(dev, port, cfg.peer_mtu),
                    gid_check(dev, port, cfg.env.get(GID_ENV))]
    if not dev.ports:
        out.append(Check(G, f"{dev.name} ports", Status.FAIL, "the device has no port",
                         "reload the driver (modprobe -r mlx5_ib; modprobe mlx5_ib)"))
    return out


def checks(cfg: DoctorConfig) -> list[Check]:
    devices = discover(cfg.root)
    present = ", ".join(d.name for d in devices) or "none"
    if cfg.device:
        devices = [d for d in devices if d.name == cfg.device]
        if not devices:
            return [Check(G, "devices", Status.FAIL, f"no RDMA device '{cfg.device}' "
                          f"(present: {present})", "check the name with `ibv_devices`, or "
                          "load the driver (modprobe mlx5_ib)")]
    if not devices:
        return [Check(G, "devices", Status.SKIPPED, "no RDMA device under "
                      f"{cfg.path('sys/class/infiniband')}: tcp and shm transports only")]
    out = [Check(G, "devices", Status.OK, f"{len(devices)} device(s): " + ", ".join(
        f"{d.name} ({d.hca_type or 'unknown HCA'}, fw {d.fw_ver or '?'}, NUMA "
        f"{'?' if d.numa_node is None else d.numa_node}, {d.source})" for d in devices),
        data={"devices": [d.name for d in devices]})]
    for dev in devices:
        out += device_checks(dev, cfg)
    return out + rdma_limits.checks(devices, cfg)
