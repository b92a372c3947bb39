"""The store master's object events (`mooncake store master --kv-events`) followed by the
conductor's indexer: a real master process, real store clients in their own processes
(tests/helpers/store_kv_node.py) putting our KV block objects, removing them, filling DRAM
until the master evicts (to a node's SSD tier, or away) and dying; a conductor with the
store registered as a `type: "Mooncake"` stream. Each /query is checked against what the
master itself says it holds, per tier. Publishing is off unless asked (no socket bound)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.http import jsonhttp
from mooncake_cli.kvkeys import KVNamespace, block_keys
from tests.conftest import free_port, wait_for
from tests.helpers.indexer_calls import (
    AUTH,
    m,
    running_conductor,
    settles,
    spec_hashes,
    streams,
)
from tests.helpers.store_procs import HERE, Proc, proc_list

NS: dict[str, Any] = {"model": "m", "dtype": "float16", "block_size": 16, "layers": 1,
                      "kv_heads": 1, "head_dim": 8}
T = list(range(1000, 1100))  # 6 whole blocks of 16
U = list(range(7000, 7064))  # 4 blocks of another prompt
KEYS = block_keys(T, KVNamespace(**NS))
BLOCK = 64 << 10  # bytes of each object


def master(*extra: str) -> Proc:
    return Proc([sys.executable, "-m", "mooncake_cli", "--json", "store", "master", "--port",
                 "0", *extra])


def node(addr: str, *extra: str) -> Proc:
    return Proc([sys.executable, str(HERE / "store_kv_node.py"), "--master", addr, *extra])


def ask(p: Proc, **cmd: Any) -> dict[str, Any]:
    ans = p.ask(**cmd)
    assert ans["ok"], ans
    return ans


def register(svc: ConductorService, mst: Proc, instance: str = "store") -> None:
    body = {"endpoint": mst.ready["kv_events"], "replay_endpoint":
            mst.ready["kv_events_replay"], "type": "Mooncake", "modelname": "*",
            "instance_id": instance, "block_size": 1}
    ans = jsonhttp.call(svc.url + "/register", body, auth=AUTH)
    assert ans.status == 200, ans.body


def query(svc: ConductorService, tokens: list[int], **body: Any) -> Any:
    ans = jsonhttp.call(svc.url + "/query", {"model": "m", "block_size": 16, "token_ids": tokens,
                                         **body})
    assert ans.status == 200, ans.body
    return ans.body


def truth(p: Proc, keys: list[str]) -> dict[str, Any]:
    """The answer /query should give for `keys`, from the tiers the master reports."""
    tiers = ask(p, cmd="tiers", keys=keys)["tiers"]
    lead = {"any": 0, "dram": 0, "ssd": 0}
    for name in lead:
        for t in tiers:
            if not (t if name == "any" else name in t):
                break
            lead[name] += 1
    bs: int = NS["block_size"]
    return {"default": {"store": m(lead["any"] * bs, 0, lead["dram"] * bs, lead["ssd"] * bs,
                                   {"0": lead["any"] * bs})}}


def agrees(svc: ConductorService, p: Proc, tokens: list[int], keys: list[str]) -> None:
    """Wait until /query answers what the master holds (re-read each time), then check it."""
    wait_for(lambda: query(svc, tokens) == truth(p, keys), 30, 0.1, "the index to agree")
    assert query(svc, tokens) == truth(p, keys)


@pytest.fixture
def conductor() -> Iterator[ConductorService]:
    yield from running_conductor()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    yield from proc_list()


def _listening(pid: int) -> set[int]:
    """TCP ports the process `pid` listens on (from /proc: its sockets' inodes)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def test_off_by_default_and_on_when_asked(procs) -> None:
    off = master()
    procs.append(off)
    assert "kv_events" not in off.ready
    port = int(off.ready["address"].rsplit(":", 1)[1])
    assert _listening(off.proc.pid) == {port}
    on = master("--kv-events", "tcp://127.0.0.1:0")
    procs.append(on)
    pub, replay = on.ready["kv_events"], on.ready["kv_events_replay"]
    assert pub.startswith("tcp://127.0.0.1:") and replay.startswith("tcp://127.0.0.1:")
    ports = {int(e.rsplit(":", 1)[1]) for e in (on.ready["address"], pub, replay)}
    assert _listening(on.proc.pid) == ports


def test_puts_removes_evictions_and_a_lost_node(conductor, procs) -> None:
    mst = master("--kv-events", "tcp://127.0.0.1:0", "--client-ttl", "2",
                 "--high-watermark", "0.7")
    procs.append(mst)
    register(conductor, mst)
    a = node(mst.ready["address"], "--segment-size", str(1 << 20))
    procs.append(a)
    assert ask(a, cmd="blocks", tokens=T, ns=NS, size=BLOCK)["keys"] == KEYS
    ask(a, cmd="put", key="vllm@tp0@abc", size=BLOCK)  # not one of ours: counted only
    settles(lambda: query(conductor, T), {"default": {"store": m(96, 0, 96, 0, {"0": 96})}})
    assert query(conductor, T[:40]) == {"default": {"store": m(32, 0, 32, 0, {"0": 32})}}
    # another model, block size, a LoRA, hashes alone: the store (modelname "*") holds none
    zero = {"default": {"store": m(0, 0, 0, 0, {"0": 0})}}
    for scope in ({"model": "other"}, {"block_size": 32}, {"lora_name": "x"}):
        assert query(conductor, T, **scope) == zero, scope
    by_hash = jsonhttp.call(conductor.url + "/query_by_hash", {
        "model": "m", "block_size": 16, "seq_hashes": spec_hashes(T, 16)})
    assert (by_hash.status, by_hash.body) == (200, zero)
    assert query(conductor, T, tenant_id="t2") == {"t2": {}}
    s = streams(conductor)["store|0"]
    assert (s["counts"]["foreign"], s["blocks"]) == (1, {"cpu": 6})
    assert s["namespaces"] == ["m/float16/1x1x16x8"]
    assert conductor.indexer.store_depth(KEYS) == {"longest": 6, "cpu": 6, "disk": 0}

    ask(a, cmd="remove", key=KEYS[3])
    settles(lambda: query(conductor, T), {"default": {"store": m(48, 0, 48, 0, {"0": 48})}})
    assert conductor.indexer.store_depth(KEYS) == {"longest": 3, "cpu": 3, "disk": 0}

    # filling DRAM past the high watermark evicts the least recently used: ours first
    for i in range(12):
        ask(a, cmd="put", key=f"fill/{i}", size=BLOCK)
    assert truth(a, KEYS[:1])["default"]["store"]["CPU"] == 0, "nothing evicted"
    agrees(conductor, a, T, KEYS)
    assert streams(conductor)["store|0"]["counts"]["removed"] >= 2

    # a node that dies takes its replicas with it once its client TTL runs out
    b = node(mst.ready["address"], "--segment-size", str(4 << 20))
    procs.append(b)
    keys_u = ask(b, cmd="blocks", tokens=U, ns=NS, size=1024)["keys"]
    settles(lambda: query(conductor, U), {"default": {"store": m(64, 0, 64, 0, {"0": 64})}})
    assert conductor.indexer.store_depth(keys_u)["cpu"] == 4
    b.kill()
    settles(lambda: query(conductor, U), {"default": {"store": m(0, 0, 0, 0, {"0": 0})}})


def test_eviction_to_ssd_is_a_move_between_tiers(conductor, procs, tmp_path) -> None:
    mst = master("--kv-events", "tcp://127.0.0.1:0", "--high-watermark", "0.7")
    procs.append(mst)
    register(conductor, mst)
    a = node(mst.ready["address"], "--segment-size", str(1 << 20), "--ssd-dir",
             str(tmp_path), "--ssd-size", str(8 << 20))
    procs.append(a)
    ask(a, cmd="blocks", tokens=T, ns=NS, size=BLOCK)
    settles(lambda: query(conductor, T), {"default": {"store": m(96, 0, 96, 0, {"0": 96})}})
    for i in range(8):  # past the watermark, not past the segment (offloads take time)
        ask(a, cmd="put", key=f"fill/{i}", size=BLOCK)
    wait_for(lambda: truth(a, KEYS[:1])["default"]["store"]["DISK"] > 0, 30, 0.1,
             "an offload to SSD")
    agrees(conductor, a, T, KEYS)
    got = query(conductor, T)["default"]["store"]
    assert got["DISK"] > 0 and got["longest_matched"] == 96, got


def test_a_late_subscriber_catches_up_by_replay(procs) -> None:
    """Events published before anyone listened are replayed to the first subscriber (the
    master's XPUB hears it join and publishes an empty batch: a gap from 0)."""
    from mooncake_cli.conductor.indexer import Indexer

    mst = master("--kv-events", "tcp://127.0.0.1:0")
    procs.append(mst)
    a = node(mst.ready["address"], "--segment-size", str(2 << 20))
    procs.append(a)
    ask(a, cmd="blocks", tokens=T, ns=NS, size=1024)
    ask(a, cmd="remove", key=KEYS[4])
    ix = Indexer()
    try:
        ix.follow_store(mst.ready["kv_events"], mst.ready["kv_events_replay"])
        wait_for(lambda: ix.store_depth(KEYS)["longest"] == 4, 20, 0.05, "the replay")
        counts = ix.snapshot()[0]["counts"]
        assert counts["replayed"] >= 1 and counts.get("unrecovered", 0) == 0, counts
        assert (counts["cleared"], counts["stored"], counts["removed"]) == (1, 6, 1), counts
        assert ix.store_depth(KEYS) == {"longest": 4, "cpu": 4, "disk": 0}
    finally:
        ix.close()


def test_a_conductor_started_with_store_events(procs) -> None:
    """`mooncake conductor start --store-events`: the store followed without a /register."""
    from tests.helpers.conductor_procs import ConductorProc

    mst = master("--kv-events", "tcp://127.0.0.1:0")
    procs.append(mst)
    a = node(mst.ready["address"], "--segment-size", str(2 << 20))
    procs.append(a)
    ask(a, cmd="blocks", tokens=T, ns=NS, size=1024)
    cond = ConductorProc("--model", "demo", "--store-events", mst.ready["kv_events"],
                         "--store-events-replay", mst.ready["kv_events_replay"])
    try:
        url = cond.serving().url
        want = {"default": {"store": m(96, 0, 96, 0, {"0": 96})}}

        def answer() -> Any:
            return jsonhttp.call(url + "/query", {"model": "m", "block_size": 16,
                                                  "token_ids": T}).body

        settles(answer, want)
        ask(a, cmd="remove", key=KEYS[0])
        settles(answer, {"default": {"store": m(0, 0, 0, 0, {"0": 0})}})
    finally:
        cond.stop()


def test_a_restarted_master_is_a_new_stream(conductor, procs) -> None:
    """A master restarted on the same endpoints (its blocks gone with its node): the index
    forgets the old master's objects and follows the new one's (its topic names the process,
    whatever sequence number it has reached)."""
    pub, replay = free_port(), free_port()
    args = ("--kv-events", f"tcp://127.0.0.1:{pub}", "--kv-events-replay",
            f"tcp://127.0.0.1:{replay}")
    old = master(*args)
    procs.append(old)
    register(conductor, old)
    a = node(old.ready["address"], "--segment-size", str(2 << 20))
    procs.append(a)
    ask(a, cmd="blocks", tokens=T, ns=NS, size=1024)
    settles(lambda: query(conductor, T), {"default": {"store": m(96, 0, 96, 0, {"0": 96})}})
    a.kill()
    old.kill()
    new = master(*args)
    procs.append(new)
    b = node(new.ready["address"], "--segment-size", str(2 << 20))
    procs.append(b)
    ask(b, cmd="blocks", tokens=U, ns=NS, size=1024)
    for i in range(10):  # more batches than the old master published
        ask(b, cmd="put", key=f"x/{i}", size=1024)
    ask(b, cmd="remove", key=block_keys(U, KVNamespace(**NS))[3])
    settles(lambda: (query(conductor, T), query(conductor, U)),
            ({"default": {"store": m(0, 0, 0, 0, {"0": 0})}},
             {"default": {"store": m(48, 0, 48, 0, {"0": 48})}}))
    assert streams(conductor)["store|0"]["counts"]["restarts"] >= 1
