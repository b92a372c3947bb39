"""`ip` and `tc` as subprocesses: namespaces, veth pairs, addresses, routes and sysctls.

Every command names a namespace made here (`ip -n NS ...`); none touches the root
namespace's interfaces or routes. Both ends of a veth pair are created directly inside their
namespaces, so they never appear in the root namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from mooncake_cli.interfaces import MooncakeError


class TestbedError(MooncakeError):
    """`ip`/`tc` failed, or this process may not make namespaces."""

    __test__ = False  # not a pytest class


def check_can_make() -> None:
    """Raise TestbedError unless this process is root and has `ip` with netns support."""
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root: network namespaces, veth pairs and tc "
                           "shaping are made with `ip netns` (run as root)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise TestbedError(f"the testbed needs `{tool}` (iproute2) on PATH")
    run(["ip", "netns", "list"])


def run(argv: list[str], check: bool = True) -> str:
    """Run `argv`; its stdout, or TestbedError with its stderr's first line."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TestbedError(f"`{' '.join(argv)}` failed: {e}") from None
    if check and done.returncode != 0:
        why = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}")
        raise TestbedError(f"`{' '.join(argv)}` failed: {why.splitlines()[0]}")
    return done.stdout


def namespaces() -> list[str]:
    """The names of every network namespace `ip netns` knows."""
    out = run(["ip", "-j", "netns", "list"]).strip()
    return [str(n["name"]) for n in json.loads(out)] if out else []


def add_namespace(ns: str) -> None:
    run(["ip", "netns", "add", ns])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    # forwarding is per namespace; loose checks let a reply come back along another path
    for key in ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0"):
        run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", key])


def delete_namespace(ns: str) -> None:
    """Kill what still runs in `ns`, then delete it (and the veth ends inside)."""
    pids = run(["ip", "netns", "pids", ns], check=False).split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass
    run(["ip", "netns", "delete", ns])


def add_veth(ns_a: str, if_a: str, mtu_a: int, ns_b: str, if_b: str, mtu_b: int) -> None:
    run(["ip", "link", "add", if_a, "netns", ns_a, "mtu", str(mtu_a), "type", "veth",
         "peer", "name", if_b, "netns", ns_b, "mtu", str(mtu_b)])


def add_address(ns: str, dev: str, cidr: str) -> None:
    run(["ip", "-n", ns, "addr", "add", cidr, "dev", dev])
    run(["ip", "-n", ns, "link", "set", dev, "up"])


def add_route(ns: str, dest: str, via: str, dev: str) -> None:
    run(["ip", "-n", ns, "route", "add", f"{dest}/32", "via", via, "dev", dev])


def mtus(ns: str) -> dict[str, int]:
    """Interface -> MTU inside `ns`."""
    raw = json.loads(run(["ip", "-n", ns, "-j", "link", "show"]) or "[]")
    return {str(i["ifname"]): int(i["mtu"]) for i in raw if "mtu" in i}


def addresses(ns: str) -> dict[str, list[str]]:
    """Interface -> IPv4 addresses inside `ns`."""
    raw = json.loads(run(["ip", "-n", ns, "-j", "-4", "addr", "show"]) or "[]")
    return {str(i["ifname"]): [str(a["local"]) for a in i.get("addr_info", [])] for i in raw}
