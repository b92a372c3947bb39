"""Topology checks: the measured link matrix between the hosts whose relays are given
(`--relay HOST:PORT`, each a `mooncake transfer serve --relay-port`), and MTU mismatches
between them.

Each relay reads PROBE_BYTES twice from every other host's relay buffer with its own engine
(the faster read gives the link's bandwidth, so measured in the direction other -> it) after
three small reads (the least is the latency). Each also says the MTU of its route to every
other host: two hosts whose routes to each other differ in MTU are flagged (TCP agrees on the
smaller segment, but datagrams and RDMA over the larger one are dropped).
"""

from __future__ import annotations

from typing import Any

from mooncake_cli.config import human_size
from mooncake_cli.doctor.check import Check, DoctorConfig, Status
from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.transfer.relay_wire import RelayConnection

G = "topology"
PROBE_BYTES = 4 << 20


def _host(address: str) -> str:
    return address.rpartition(":")[0].strip("[]")


def measure(cfg: DoctorConfig) -> tuple[list[dict[str, Any]], list[Check]]:
    """Every relay's info and its probes of every other; the failures as checks."""
    hosts: list[dict[str, Any]] = []
    failed: list[Check] = []
    conns: list[RelayConnection] = []
    try:
        for address in cfg.relays:
            try:
                conn = RelayConnection(address, cfg.secret or None, max(cfg.timeout, 10.0))
            except MooncakeError as e:
                failed.append(Check(G, f"relay {address}", Status.FAIL, str(e),
                                    "is `mooncake transfer serve --relay-port` running there, "
                                    "reachable, and given the same --secret?"))
                continue
            conns.append(conn)
            lease = conn.call({"op": "lease", "slots": 1})
            hosts.append({"relay": address, "host": _host(address),
                          "segment": lease["segment"], "offset": int(lease["offsets"][0]),
                          "chunk": int(lease["chunk"]), "conn": conn})
        for me in hosts:
            others = [h for h in hosts if h is not me]
            info = me["conn"].call({"op": "info", "hosts": [o["host"] for o in others]})
            me["mtu"] = {o["relay"]: info["mtu"].get(o["host"]) for o in others}
            me["links"] = {}
            for o in others:
                try:
                    me["links"][o["relay"]] = me["conn"].call(
                        {"op": "probe", "slot": 0, "target": o["segment"], "offset": o["offset"],
                         "length": min(PROBE_BYTES, me["chunk"], o["chunk"])})
                except MooncakeError as e:
                    failed.append(Check(G, f"link {o['relay']} -> {me['relay']}", Status.FAIL,
                                        str(e), "can these hosts reach each other's engine "
                                                "port? (`mooncake doctor --peer` on each)"))
    except MooncakeError as e:
        failed.append(Check(G, "link matrix", Status.FAIL, str(e)))
    finally:
        for conn in conns:
            conn.close()
    for h in hosts:
        h.pop("conn", None)
    return hosts, failed


def matrix_check(hosts: list[dict[str, Any]]) -> Check:
    rows: list[str] = []
    matrix: dict[str, dict[str, Any]] = {}
    for me in hosts:
        for src, got in me.get("links", {}).items():
            entry = {"bandwidth_bytes_per_s": got["bandwidth"], "latency_s": got["latency"],
                     "probe_bytes": got["bytes"]}
            matrix.setdefault(src, {})[me["relay"]] = entry
            rows.append(f"{src} -> {me['relay']}: {human_size(got['bandwidth'])}/s, "
                        f"{got['latency'] * 1e3:.2f} ms")
    data = {"hosts": [{k: h[k] for k in ("relay", "segment")} for h in hosts],
            "matrix": matrix}
    if not rows:
        return Check(G, "link matrix", Status.SKIPPED, "fewer than two relays answered",
                     data=data)
    return Check(G, "link matrix", Status.OK, f"{len(rows)} link(s) measured between "
                 f"{len(hosts)} hosts (bandwidth: the faster of two {human_size(PROBE_BYTES)} "
                 "reads; latency: the fastest 4 KiB read):\n" + "\n".join(rows), data=data)


def mtu_checks(hosts: list[dict[str, Any]]) -> list[Check]:
    out = []
    for i, x in enumerate(hosts):
        for y in hosts[i + 1:]:
            mx, my = x.get("mtu", {}).get(y["relay"]), y.get("mtu", {}).get(x["relay"])
            data = {"hosts": [x["relay"], y["relay"]], "mtu": [mx, my]}
            name = f"MTU {x['relay']} / {y['relay']}"
            if mx is None or my is None:
                out.append(Check(G, name, Status.SKIPPED, "a route's MTU is unknown", data=data))
            elif mx != my:
                out.append(Check(G, name, Status.WARN, f"MTU mismatch: {x['relay']}'s route to "
                                 f"{y['relay']} has MTU {mx}, the way back {my}: TCP agrees on "
                                 "the smaller segment, but larger datagrams (and RDMA) from "
                                 f"the {max(mx, my)} side are dropped",
                                 f"give both ends the same MTU (ip link set DEV mtu "
                                 f"{min(mx, my)} on the {max(mx, my)} side, or raise the other)",
                                 data))
            else:
                out.append(Check(G, name, Status.OK, f"both routes MTU {mx}", data=data))
    return out


def checks(cfg: DoctorConfig) -> list[Check]:
    if not cfg.relays:
        return [Check(G, "link matrix", Status.SKIPPED, "no --relay given",
                      "pass --relay HOST:PORT of each host's `mooncake transfer serve "
                      "--relay-port` to measure the links between them")]
    hosts, failed = measure(cfg)
    return [*failed, matrix_check(hosts), *mtu_checks(hosts)]
