"""The nixl transport with the real nixl-cu12 package and its UCX backend, across processes
(UCX over cma/TCP here): descriptors carry the agent, metadata travels through p2p, http and
etcd, out-of-region requests are refused before any transfer, a kill -9 of the peer
mid-batch is FAILED within the timeout, and `auto` says why it picked what it picked."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time

import pytest

from mooncake_cli.interfaces import SegmentDescriptor
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.batch import Op, State, TransferRequest
from mooncake_cli.transfer.spi import Slice
from tests.conftest import wait_for

T = "mooncake.transports"
MiB = 1 << 20
NIXL = next((p for p in Registry().plugins(T) if p.name == "nixl"), None)
pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(NIXL is None or not NIXL.available,
                                 reason=f"nixl unavailable: {NIXL and NIXL.reason}")]


def test_descriptors_carry_the_agent_and_each_registered_region(make_engine) -> None:
    eng = make_engine()
    region = eng.allocate(MiB)
    desc = SegmentDescriptor.from_json(eng.descriptor().to_json())
    assert desc.extra["nixl.agent"].startswith("mooncake-") and len(desc.extra["nixl"]) > 100
    mem, addr, dev = desc.regions[0].extra["nixl"].split(":")
    assert (mem, dev) == ("DRAM", "0") and int(addr) > 0
    assert desc.regions[0].shm == region.shm  # shm keeps its own field beside nixl's
    eng.unregister(region)
    assert eng.descriptor().regions == ()


@pytest.mark.parametrize("metadata", ["p2p", "http", "etcd"])
def test_round_trip_across_processes_through_each_metadata_backend(
        metadata, spawn_target, make_engine, metadata_server, request) -> None:
    url = {"p2p": "p2p", "http": getattr(metadata_server, "url", "")}.get(metadata) or \
        (request.getfixturevalue("etcd") if metadata == "etcd" else "")
    t = spawn_target(8 * MiB, metadata=url, name=None if metadata == "p2p" else "nixl-target")
    eng = make_engine(transport="nixl", metadata=url, name="" if metadata == "p2p" else "me")
    assert eng.transport_for(t.segment) == "nixl"
    data = os.urandom(8 * MiB)
    src, dst = eng.register(bytearray(data)), eng.register(bytearray(8 * MiB))
    assert eng.transfer(Op.WRITE, src, 0, t.segment, t.offset, 8 * MiB).state is State.COMPLETED
    assert eng.transfer(Op.READ, dst, 0, t.segment, t.offset, 8 * MiB).state is State.COMPLETED
    assert bytes(dst.view) == data


def test_a_secret_keeps_the_agent_out_of_published_metadata(spawn_target, make_engine,
                                                            metadata_server) -> None:
    t = spawn_target(4 * MiB, secret="s3", metadata=metadata_server.url, name="locked")
    published = make_engine(metadata=metadata_server.url, name="peek").metadata.lookup("locked")
    assert "nixl" not in published.extra  # only DESCRIBE, behind the handshake, carries it
    assert any(r.extra.get("nixl") for r in published.regions)
    eng = make_engine(transport="nixl", metadata=metadata_server.url, name="ok", secret="s3")
    src = eng.register(bytearray(os.urandom(MiB)))
    assert eng.transfer(Op.WRITE, src, 0, "locked", t.offset, MiB).state is State.COMPLETED
    bad = make_engine(transport="nixl", metadata=metadata_server.url, name="bad", secret="no")
    src2 = bad.register(bytearray(MiB))
    [st] = bad.submit([TransferRequest(Op.WRITE, src2, 0, "locked", t.offset, MiB)]).wait(10)
    assert st.state is State.FAILED and "secret" in st.reason


def test_an_agent_no_peer_knows_makes_no_idle_progress_until_described(make_engine) -> None:
    tgt = make_engine()  # p2p: its descriptor leaves only by DESCRIBE
    ep = tgt.endpoints.by_name["nixl"]
    region = tgt.allocate(MiB)
    shown = make_engine().endpoints.by_name["nixl"]  # the control: one that may be known
    shown.shown()
    wait_for(lambda: shown.idle_pumps >= 60, 30, what="60 idle pumps of a shown agent")
    assert ep.idle_pumps == 0  # while another agent pumped 60 times, this one made none
    eng = make_engine(transport="nixl")
    data = os.urandom(MiB)
    src = eng.register(bytearray(data))
    assert eng.transfer(Op.WRITE, src, 0, tgt.name, region.base, MiB).state is State.COMPLETED
    assert bytes(region.view) == data
    # described to a peer: it progresses its wire-up from then on
    wait_for(lambda: ep.idle_pumps > 0, 30, what="the described agent to pump")


def test_out_of_region_requests_are_refused_before_any_transfer(make_engine) -> None:
    tgt = make_engine()
    a, b = tgt.allocate(MiB), tgt.allocate(MiB)  # adjacent in the segment's offset space
    eng = make_engine(transport="nixl")
    src = eng.register(bytearray(b"\xab" * (2 * MiB)))
    reqs = [TransferRequest(Op.WRITE, src, 0, tgt.name, a.base + MiB - 4096, 2 * 4096),
            TransferRequest(Op.WRITE, src, 0, tgt.name, b.base + MiB, 16),
            TransferRequest(Op.READ, src, 0, tgt.name, b.base - 1 + 2 * MiB, 2),
            TransferRequest(Op.WRITE, src, 0, tgt.name, b.base + 16, 4096)]
    statuses = eng.submit(reqs).wait(10)
    assert [s.state for s in statuses] == [State.FAILED] * 3 + [State.COMPLETED]
    assert all("bounds" in s.reason for s in statuses[:3])
    assert bytes(a.view) == bytes(MiB)  # not even the in-region head of the first moved
    assert bytes(b.view[:16]) == bytes(16) and bytes(b.view[16:16 + 4096]) == b"\xab" * 4096
    # the nixl channel refuses them itself too, before NIXL sees an address
    peer = eng._peer(tgt.name)
    ch = peer.acquire()
    got: list[tuple[int, str | None]] = []
    ch.post([Slice("write", src, 0, 8192, a.base + MiB - 4096)],
            lambda k, why: got.append((k, why)), 5)
    peer.release(ch)
    assert len(got) == 1 and got[0][1] and "bounds" in got[0][1]
    assert bytes(a.view) == bytes(MiB)


def test_kill_9_of_the_peer_mid_batch_is_failed_within_the_timeout(spawn_target,
                                                                   make_engine) -> None:
    timeout = 3.0
    t = spawn_target(64 * MiB)
    eng = make_engine(transport="nixl", timeout=timeout)
    local = eng.allocate(64 * MiB, shared=False)
    assert eng.transfer(Op.WRITE, local, 0, t.segment, t.offset, MiB).state is State.COMPLETED
    # 2 GiB in 1 MiB requests: ~0.2-0.5 s of copying here (UCX's cma copies while posting),
    # and the kill comes 50 ms in, from another thread
    reqs = [TransferRequest(Op.WRITE if i % 2 else Op.READ, local, (i % 64) * MiB, t.segment,
                            t.offset + (i % 64) * MiB, MiB) for i in range(2048)]
    killed: list[float] = []

    def kill() -> None:
        os.kill(t.pid, 9)
        killed.append(time.monotonic())

    timer = threading.Timer(0.05, kill)
    t0 = time.monotonic()
    timer.start()
    batch = eng.submit(reqs)
    statuses = batch.wait(timeout + 2)
    elapsed = time.monotonic() - t0
    timer.join()
    t.kill()
    assert all(s.state is not State.PENDING for s in statuses)
    assert elapsed < timeout + 1
    assert killed and statuses[-1].state is State.FAILED, "the batch ended before the kill"
    failed = [s for s in statuses if s.state is State.FAILED]
    assert failed and all(s.reason for s in failed)
    t1 = time.monotonic()  # the dead peer is noticed at once from now on
    [st] = eng.submit([TransferRequest(Op.READ, local, 0, t.segment, t.offset, MiB)]).wait(
        timeout + 2)
    assert st.state is State.FAILED and st.reason
    assert time.monotonic() - t1 < timeout


def test_auto_picks_shm_here_and_says_why(make_engine, caplog) -> None:
    tgt = make_engine()
    tgt.allocate(MiB)
    eng = make_engine()  # auto: no RDMA or CUDA here, so nixl does not outrank shm/tcp
    with caplog.at_level(logging.INFO, logger="mooncake.transfer"):
        assert eng.transport_for(tgt.name) == "shm"
    chosen, why = eng.transport_choices()[tgt.name]
    assert chosen == "shm" and "same host" in why
    assert any("transport shm" in r.getMessage() and tgt.name in r.getMessage()
               for r in caplog.records)
    nixl = Registry().get(T, "nixl")
    assert nixl.priority < 10 and "--transport nixl" in nixl.why_priority()


def test_plugins_lists_nixl_and_when_auto_picks_it(tmp_path) -> None:
    from typer.testing import CliRunner

    from mooncake_cli.app import app

    r = CliRunner().invoke(app, ["--json", "plugins", "--group", T])
    assert r.exit_code == 0, r.output
    rows = {p["name"]: p for p in json.loads(r.stdout)}
    assert rows["nixl"]["available"] is True
    assert "no RDMA or CUDA" in rows["nixl"]["choice"] and rows["nixl"]["priority"] == 5
    assert rows["shm"]["priority"] > rows["tcp"]["priority"] > rows["nixl"]["priority"]


def test_bench_puts_nixl_beside_the_api_floor_our_tcp_and_memcpy() -> None:
    from typer.testing import CliRunner

    from mooncake_cli.app import app

    r = CliRunner().invoke(app, ["--json", "bench", "transfer", "--transport", "nixl",
                                 "--duration", "0.2", "--block-size", "1MiB", "--op", "read",
                                 "--buffer-size", "8MiB"])
    assert r.exit_code == 0, r.output
    [rep] = json.loads(r.stdout)["reports"]
    rows = {x["name"]: x for x in rep["results"]}
    assert list(rows) == ["ours", "nixl api", "tcp", "memcpy"]
    assert (rows["ours"]["transport"], rows["tcp"]["transport"]) == ("nixl", "tcp")
    assert all(x["verified"] and x["gbps"] > 0 for x in rows.values())
    assert set(rep["ratios"]) == {"nixl api", "tcp", "memcpy"}


def test_where_ucx_has_rdma_or_cuda_auto_picks_nixl_except_same_host_cpu_memory(
        make_engine) -> None:
    from mooncake_backends.nixl import NixlTransport
    from mooncake_backends.shm import ShmTransport
    from mooncake_backends.tcp import TcpTransport

    from mooncake_cli.transfer.directory import choose

    nixl = NixlTransport()
    nixl.priority, nixl.fast = 30, "RDMA (mlx5_0:1)"  # as on a host where UCX reports verbs
    ts = [TcpTransport(), ShmTransport(), nixl]
    peer = make_engine()
    peer.allocate(MiB)  # shm-backed CPU memory
    same_host = peer.descriptor()
    local = dataclasses.replace(same_host, name="me")
    assert choose(ts, same_host, local)[0].name == "shm"  # a mapped copy beats any UCX path
    other_host = dataclasses.replace(same_host, boot_id="another-boot")
    chosen, why = choose(ts, other_host, local)
    assert chosen is nixl and why == "nixl: UCX over RDMA (mlx5_0:1)"
    gpu = dataclasses.replace(same_host, regions=tuple(
        dataclasses.replace(r, location="cuda:0") for r in same_host.regions))
    assert choose(ts, gpu, local)[0] is nixl  # GPU memory on this host: CUDA IPC
    plain = make_engine()
    plain.register(bytearray(MiB))  # CPU memory without shm: shm's kernel copies (cma, as
    assert choose(ts, plain.descriptor(), local)[0].name == "shm"  # UCX's would be)
    assert choose([TcpTransport(), nixl], plain.descriptor(), local)[0] is nixl  # cma > tcp


def test_a_plain_buffer_unregistered_by_the_peer_is_refused_after_the_refresh(
        make_engine) -> None:
    from mooncake_backends.nixl.channel import REFRESH

    tgt = make_engine()
    keep, gone = tgt.register(bytearray(MiB)), tgt.register(bytearray(MiB))
    eng = make_engine(transport="nixl")
    src = eng.register(bytearray(b"\x5a" * MiB))
    assert eng.transfer(Op.WRITE, src, 0, tgt.name, gone.base, MiB).state is State.COMPLETED
    tgt.unregister(gone)  # still mapped: the bytearray lives on in `gone.keep`
    gone.view[:] = bytes(MiB)
    time.sleep(REFRESH + 0.1)  # sleep: behaviour - a TTL to outlast: the fetched table is stale
    [st] = eng.submit([TransferRequest(Op.WRITE, src, 0, tgt.name, gone.base, MiB)]).wait(10)
    assert st.state is State.FAILED and "bounds" in st.reason
    assert bytes(gone.view) == bytes(MiB)  # nothing landed in the unregistered buffer
    assert eng.transfer(Op.WRITE, src, 0, tgt.name, keep.base, MiB).state is State.COMPLETED


def test_the_vram_check_runs_its_device_path_on_host_tensors() -> None:
    """`python -m mooncake_cli.bench.vram --device cuda` is the GPU machine's check; on
    `--device cpu` the same code moves host tensors (DRAM regions) between two processes."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "mooncake_cli.bench.vram", "--device", "cpu",
                        "--sizes", "1MiB,4MiB", "--duration", "0.2"], capture_output=True,
                       text=True, timeout=100)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    rows = [(x["row"], x["op"], x["bytes"]) for x in out["rows"]]
    assert rows == [("nixl", "write", MiB), ("nixl", "read", MiB), ("device copy", "copy", MiB),
                    ("nixl", "write", 4 * MiB), ("nixl", "read", 4 * MiB),
                    ("device copy", "copy", 4 * MiB)]
    assert all(x["gbps"] > 0 for x in out["rows"])
    assert all(x["verified"] and x["vs_device_copy"] > 0 for x in out["rows"] if x["row"] == "nixl")
