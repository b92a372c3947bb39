"""Environment checks: proxies that would capture cluster traffic, what the local hostname
resolves to, whether the engine's port can be bound, and whether the kernel lets same-host
processes copy into each other's private memory (shm's cross-memory copies)."""

from __future__ import annotations

import errno
import ipaddress
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping

from mooncake_cli.doctor.check import Check, DoctorConfig, Status, is_loopback

G = "environment"
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy")


def _no_proxy_covers(host: str, no_proxy: str) -> bool:
    """What requests and curl do with no_proxy: `*`, names and their subdomains (with or
    without a leading dot, ports ignored), and IP CIDR blocks."""
    host = host.lower().strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for raw in no_proxy.lower().split(","):
        entry = raw.strip()
        if not entry:
            continue
        if entry == "*":
            return True
        if ip is not None and "/" in entry:
            try:
                if ip in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        if entry.count(":") == 1:  # host:port
            entry = entry.rsplit(":", 1)[0]
        name = entry.lstrip(".")
        if host == name or host.endswith("." + name):
            return True
    return False


def proxy_check(env: Mapping[str, str], hosts: list[str]) -> Check:
    """Fail when a proxy variable is set and some cluster host is not covered by no_proxy."""
    found = {k: env[k] for v in PROXY_VARS for k in (v, v.upper()) if env.get(k)}
    if not found:
        return Check(G, "proxy", Status.OK, "no http_proxy, https_proxy or all_proxy set")
    no_proxy = ",".join(x for x in (env.get("no_proxy", ""), env.get("NO_PROXY", "")) if x)
    names = ", ".join(sorted(found))
    if not hosts:
        return Check(G, "proxy", Status.WARN,
                     f"{names} set; no cluster host given to test against no_proxy "
                     f"({no_proxy or 'unset'})",
                     "make sure no_proxy lists the etcd, metadata and master hosts, or pass "
                     "--metadata/--master/--peer to check", {"proxies": found})
    captured = [h for h in dict.fromkeys(hosts) if not _no_proxy_covers(h, no_proxy)]
    if captured:
        wanted = ",".join(captured + ([no_proxy] if no_proxy else []))
        return Check(G, "proxy", Status.FAIL,
                     f"{names} set and no_proxy ({no_proxy or 'unset'}) does not cover "
                     f"{', '.join(captured)}: HTTP metadata and etcd traffic would go through "
                     "the proxy", f"export no_proxy={wanted} "
                     f"(and NO_PROXY), or unset {names}",
                     {"proxies": found, "captured": captured})
    return Check(G, "proxy", Status.OK,
                 f"{names} set, but no_proxy covers {', '.join(dict.fromkeys(hosts))}",
                 data={"proxies": found})


def hostname_check(name: str, remote: bool) -> Check:
    """The hostname peers are told must resolve to an address they can reach."""
    try:
        addrs = sorted({str(a[4][0]) for a in socket.getaddrinfo(name, None)})
    except OSError as e:
        return Check(G, "hostname", Status.FAIL if remote else Status.WARN,
                     f"hostname '{name}' does not resolve: {e}",
                     f"add '{name}' with this host's cluster address to /etc/hosts or DNS")
    reachable = [a for a in addrs if not is_loopback(a)]
    if reachable:
        return Check(G, "hostname", Status.OK, f"'{name}' resolves to {', '.join(addrs)}",
                     data={"addresses": addrs})
    return Check(G, "hostname", Status.FAIL if remote else Status.WARN,
                 f"'{name}' resolves only to loopback ({', '.join(addrs)}): an engine that "
                 "listens on 0.0.0.0 advertises it and remote peers cannot connect"
                 + ("" if remote else " (fine while every peer is on this host)"),
                 "give the engine --advertise CLUSTER_IP (local_hostname upstream), or map "
                 f"'{name}' to the cluster address in /etc/hosts", {"addresses": addrs})


def port_check(host: str, port: int) -> Check:
    """Bind the engine's listen address and port the way the engine would."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
            got = s.getsockname()[1]
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return Check(G, "engine port", Status.FAIL,
                             f"{host}:{port} is held by another socket",
                             f"stop what holds it (ss -ltnp 'sport = :{port}') or give the "
                             "engine another --port (0 picks a free one)",
                             {"host": host, "port": port})
            return Check(G, "engine port", Status.FAIL, f"cannot bind {host}:{port}: "
                         f"{e.strerror}", "use an address of this host in --host",
                         {"host": host, "port": port})
    what = f"{host}:{port} is free" if port else f"{host} binds (port 0 got {got})"
    return Check(G, "engine port", Status.OK, what, data={"host": host, "port": port})


_HOLDER = ("import sys, numpy as n; b = n.frombuffer(b'mooncake', n.uint8).copy(); "
           "print(b.ctypes.data, flush=True); sys.stdin.read()")


def probe_kernel_copy() -> str | None:
    """Read 8 bytes of a child process's private memory as shm does; None, or why not."""
    from mooncake_backends.shm.cma import Cma

    child = subprocess.Popen([sys.executable, "-c", _HOLDER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        addr = int(child.stdout.readline() or 0)
        if not addr:
            return "the probe process did not start"
        cma, got = Cma(child.pid, "probe"), bytearray(8)
        try:
            cma.read(addr, memoryview(got))
        finally:
            cma.close()
        return None if got == b"mooncake" else "the copy read other bytes"
    except Exception as e:  # the reason is the finding
        return str(e)
    finally:
        child.kill()
        child.wait()


def kernel_copy_check(probe: Callable[[], str | None], scope: int | None) -> Check:
    why = probe()
    if why is None:
        return Check(G, "kernel copies", Status.OK, "same-host peers copy into each other's "
                     "private memory (a vLLM KV cache) by process_vm_writev: shm, no socket",
                     data={"ptrace_scope": scope})
    return Check(G, "kernel copies", Status.WARN, f"the kernel refuses cross-memory copies "
                 f"({why}): same-host transfers into private memory go over tcp",
                 "sysctl kernel.yama.ptrace_scope=0 (the copies need ptrace rights between "
                 "the two processes: same user), or run both as root" if scope
                 else "run both processes as the same user", {"ptrace_scope": scope})


def checks(cfg: DoctorConfig) -> list[Check]:
    from mooncake_cli.doctor.nixl import ptrace_scope

    return [proxy_check(cfg.env, cfg.cluster_hosts()),
            hostname_check(socket.gethostname(), cfg.remote_peers()),
            port_check(cfg.host, cfg.port),
            kernel_copy_check(probe_kernel_copy, ptrace_scope(cfg))]
