"""Bring a testbed up and down, report it, and build the argv that runs a command inside a
host's namespace."""

from __future__ import annotations

import os
import time
from typing import Any

from mooncake_cli.testbed import netns, shaping, topology
from mooncake_cli.testbed.state import (
    Testbed,
    check_prefix,
    forget,
    ifname,
    load,
    name_limit,
    netns_name,
    save,
)

MTU = topology.MTU


def plan(prefix: str, hosts: str, links: str | None) -> Testbed:
    """The testbed `hosts` and `links` describe (parsed and checked; nothing made)."""
    check_prefix(prefix)
    names = topology.parse_hosts(hosts, name_limit(prefix))
    edges = topology.parse_links(links, names)
    return Testbed(prefix, names, edges, topology.routes(names, edges),
                   sorted(topology.forwarders(names, edges)))


def ours(prefix: str) -> list[str]:
    """Namespaces carrying `prefix-`: the recorded testbed's and any a lost record left."""
    bed = load(prefix)
    recorded = {netns_name(prefix, h) for h in bed.hosts} if bed else set()
    return sorted(n for n in netns.namespaces()
                  if n in recorded or n.startswith(f"{prefix}-"))


def down(prefix: str) -> list[str]:
    """Delete this prefix's namespaces (their veths go with them) and the record; the names
    deleted."""
    check_prefix(prefix)
    netns.check_can_make()
    gone = ours(prefix)
    for ns in gone:
        netns.delete_namespace(ns)
    forget(prefix)
    return gone


def up(bed: Testbed) -> Testbed:
    """Replace any testbed of `bed.prefix` with `bed`; torn down again if a step fails."""
    netns.check_can_make()
    down(bed.prefix)
    p = bed.prefix
    bed.created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        for h in bed.hosts:
            netns.add_namespace(netns_name(p, h))
        for k in bed.links:
            netns.add_veth(netns_name(p, k.a), ifname(p, k.b), k.mtu_a, netns_name(p, k.b),
                           ifname(p, k.a), k.mtu_b)
            for h in (k.a, k.b):
                ns, dev = netns_name(p, h), ifname(p, k.peer(h))
                netns.add_address(ns, dev, f"{k.addr(h)}/30")
                shaping.shape(ns, dev, k.rate_bps)
        for r in bed.routes:
            link = bed.links[r.link]
            netns.add_route(netns_name(p, r.host), r.dest, r.via, ifname(p, link.peer(r.host)))
        save(bed)
    except BaseException:
        down(p)
        raise
    return bed


def status(prefix: str) -> dict[str, Any]:
    """The recorded testbed with, per host, whether its namespace exists and the addresses,
    shaped rates and MTUs found in it."""
    check_prefix(prefix)
    bed = load(prefix)
    if bed is None:
        return {"prefix": prefix, "up": False, "hosts": [], "links": [],
                "stray_namespaces": ours(prefix) if os.geteuid() == 0 else []}
    live = set(netns.namespaces())
    hosts = []
    for h in bed.hosts:
        ns = netns_name(prefix, h)
        found = netns.addresses(ns) if ns in live else {}
        mtus = netns.mtus(ns) if ns in live else {}
        addrs = []
        for a in bed.addresses(h):
            a["present"] = a["address"] in found.get(a["ifname"], [])
            a["shaped_bps"] = shaping.shaped_rate(ns, a["ifname"]) if ns in live else None
            a["mtu_now"] = mtus.get(a["ifname"])
            addrs.append(a)
        hosts.append({"host": h, "netns": ns, "present": ns in live, "addresses": addrs,
                      "forwards": h in bed.forwarders})
    d = bed.to_dict()
    return {"prefix": prefix, "up": all(h["present"] for h in hosts), "created": bed.created,
            "hosts": hosts, "links": d["links"], "routes": d["routes"]}


def exec_argv(bed: Testbed, host: str, argv: list[str],
              bind: bool = False) -> tuple[list[str], dict[str, str]]:
    """The argv (`ip netns exec NS env ... CMD`) and extra environment that run `argv` in
    `host`'s namespace; `bind` also points the transfer engine's listener at its address.
    The transfer engine is held to tcp: processes in two namespaces share this machine's boot
    id and /dev/shm, so `auto` would pick shared memory between testbed hosts and bypass the
    shaped links."""
    ns = bed.netns(host)
    env = {"MOONCAKE_TESTBED_HOST": host, "MOONCAKE_TESTBED_ADDR": bed.address(host),
           "MOONCAKE_TRANSFER_TRANSPORT": "tcp"}
    if bind:
        env["MOONCAKE_TRANSFER_HOST"] = env["MOONCAKE_TESTBED_ADDR"]
    return ["ip", "netns", "exec", ns, *argv], env
