"""The transport contract: every available transport plugin (tcp, shm, and nixl where its
package is installed), against a target that is a real separate `mooncake transfer serve`
process, implements both sides of the contract, moves bytes exactly, concurrently, within
bounds, fails cleanly when the target dies, and refuses a wrong secret."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import numpy as np
import pytest

from mooncake_cli.interfaces import TransferError
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.batch import Op, State, TransferRequest

GROUP = "mooncake.transports"
TRANSPORTS = sorted(p.name for p in Registry().plugins(GROUP) if p.available)
MiB = 1 << 20

pytestmark = pytest.mark.timeout(120)


def test_some_transport_is_available() -> None:
    assert TRANSPORTS, "no transport plugin is available: the contract suite would test nothing"
    assert {"tcp", "shm"} <= set(TRANSPORTS)


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def engine(transport, target, make_engine):
    """An initiator forced onto `transport`, already resolved to the shared target."""
    eng = make_engine(transport=transport, timeout=10)
    assert eng.transport_for(target.segment) == transport
    return eng


def rand(rng: np.random.Generator, n: int) -> bytes:
    return rng.bytes(n)


def write(eng, region, loff, target, toff, n):
    return TransferRequest(Op.WRITE, region, loff, target, toff, n)


def read(eng, region, loff, target, toff, n):
    return TransferRequest(Op.READ, region, loff, target, toff, n)


def run_one(eng, req, timeout: float = 30):
    [status] = eng.submit([req]).wait(timeout)
    return status


def whole(eng, target, scratch) -> bytes:
    """The target's entire buffer, read into `scratch` (a region at least that big)."""
    status = run_one(eng, read(eng, scratch, 0, target.segment, target.offset, target.size))
    assert status.state is State.COMPLETED, status.reason
    return bytes(scratch.view[:target.size])


def test_the_plugin_implements_both_sides_of_the_contract(engine, transport, target) -> None:
    from mooncake_cli.transfer.spi import BatchChannel, Channel, Endpoint, Transport

    plugin = Registry().get(GROUP, transport)
    assert isinstance(plugin, Transport)
    assert isinstance(engine.endpoints.by_name[transport], Endpoint)
    peer = engine._peer(target.segment)
    ch = peer.acquire()
    try:
        assert isinstance(ch, Channel)  # read, write, close, and the broken/spin flags
        assert isinstance(ch, BatchChannel) is bool(getattr(plugin, "batched", False))
    finally:
        peer.release(ch)
    ok, why = plugin.reachable(peer.desc, engine.descriptor())
    assert ok and why  # reachable, with a reason for logs and `mooncake plugins`


# -- byte-exact round trips -------------------------------------------------------------------
def test_transport_for_reports_the_forced_transport(engine, transport, target) -> None:
    assert engine.transport_for(target.segment) == transport
    assert engine.descriptor().name == engine.name


def test_write_then_read_back_random_sizes_and_offsets(engine, target) -> None:
    size, base = target.size, target.offset
    rng = np.random.default_rng(20240611)
    pyrng = random.Random(20240611)
    src = engine.allocate(size + 8192, shared=False)
    dst = engine.register(bytearray(size + 8192))
    scratch = engine.register(bytearray(size))

    # maximum size: the whole buffer, both ways
    model = bytearray(rand(rng, size))
    src.view[:size] = model
    st = run_one(engine, write(engine, src, 0, target.segment, base, size))
    assert (st.state, st.transferred) == (State.COMPLETED, size), st.reason
    st = run_one(engine, read(engine, dst, 0, target.segment, base, size))
    assert (st.state, st.transferred) == (State.COMPLETED, size), st.reason
    assert bytes(dst.view[:size]) == bytes(model)

    fixed = [0, 1, 2, 3, 511, 4095, 4096, 4097, 65535, 65537, 256 * 1024 + 1, MiB - 1,
             4 * MiB + 3, 9 * MiB + 17, 17 * MiB + 1]
    sizes = fixed + [pyrng.randrange(1, 6 * MiB) for _ in range(12)]
    for k, n in enumerate(sizes):
        toff = pyrng.randrange(0, size - n + 1)
        soff, doff = pyrng.randrange(0, 8192), pyrng.randrange(0, 8192)
        while doff == soff:
            doff = pyrng.randrange(0, 8192)
        data = rand(rng, n)
        src.view[soff:soff + n] = data
        dst.view[doff:doff + n] = b"\xa5" * n
        st = run_one(engine, write(engine, src, soff, target.segment, base + toff, n))
        assert (st.state, st.transferred) == (State.COMPLETED, n), (n, toff, st.reason)
        model[toff:toff + n] = data
        st = run_one(engine, read(engine, dst, doff, target.segment, base + toff, n))
        assert (st.state, st.transferred) == (State.COMPLETED, n), (n, toff, st.reason)
        assert bytes(dst.view[doff:doff + n]) == data, f"mismatch for {n} bytes at {toff}"
        if k % 5 == 4:  # nothing outside the written ranges changed
            assert whole(engine, target, scratch) == bytes(model)
    assert whole(engine, target, scratch) == bytes(model)


def test_zero_length_requests_complete_and_change_nothing(engine, target) -> None:
    rng = np.random.default_rng(7)
    size, base = 1 * MiB, target.offset
    buf = engine.register(bytearray(rand(rng, size)))
    before_local = bytes(buf.view)
    st = run_one(engine, write(engine, buf, 0, target.segment, base, size))
    assert st.state is State.COMPLETED, st.reason
    reqs = [make(engine, buf, loff, target.segment, base + toff, 0)
            for make in (read, write)
            for loff, toff in ((0, 0), (size, 12345), (77, target.size))]
    statuses = engine.submit(reqs).wait(10)
    assert [(s.state, s.transferred) for s in statuses] == [(State.COMPLETED, 0)] * len(reqs)
    assert bytes(buf.view) == before_local
    check = engine.register(bytearray(size))
    st = run_one(engine, read(engine, check, 0, target.segment, base, size))
    assert bytes(check.view) == before_local


# -- concurrency ------------------------------------------------------------------------------
def test_concurrent_batches_from_several_threads(engine, target) -> None:
    threads_n, rounds = 6, 8
    span = target.size // threads_n // 4096 * 4096
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            rng = np.random.default_rng(1000 + k)
            lo = target.offset + k * span
            src = engine.register(bytearray(span))
            dst = engine.register(bytearray(span))
            for r in range(rounds):
                # four disjoint chunks of this thread's range, random lengths, one batch each way
                cuts = sorted((rng.choice(span - 1, size=3, replace=False) + 1).tolist())
                bounds = list(zip([0, *cuts], [*cuts, span], strict=True))
                data = rand(rng, span)
                src.view[:] = data
                dst.view[:] = b"\x00" * span
                wb = engine.submit([write(engine, src, a, target.segment, lo + a, b - a)
                                    for a, b in bounds])
                # a second batch in flight at the same time: an unrelated no-op-sized write
                extra = engine.submit([write(engine, src, 0, target.segment, lo, 1)])
                assert all(s.state is State.COMPLETED for s in wb.wait(30)), (k, r, wb.poll())
                assert extra.ok(30)
                rb = engine.submit([read(engine, dst, a, target.segment, lo + a, b - a)
                                    for a, b in bounds])
                statuses = rb.wait(30)
                assert all(s.state is State.COMPLETED for s in statuses), (k, r, statuses)
                assert [s.transferred for s in statuses] == [b - a for a, b in bounds]
                assert bytes(dst.view) == data, f"thread {k} round {r}: bytes differ"
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads), "a transfer thread hung"
    assert not errors, errors[0]


def test_batch_of_many_requests_has_per_request_status(engine, target) -> None:
    rng = np.random.default_rng(99)
    n, chunk = 240, 8192
    local = engine.register(bytearray(rand(rng, n * chunk + 2 * MiB)))
    reqs, good = [], []
    for i in range(n):
        if i % 4 == 3:  # out of bounds on the target
            reqs.append(write(engine, local, i * chunk, target.segment,
                              target.offset + target.size - 100 + i, 200))
        elif i % 9 == 8:  # out of bounds locally
            reqs.append(write(engine, local, local.length - 10, target.segment, 0, 20))
        else:
            good.append(i)
            reqs.append(write(engine, local, i * chunk, target.segment,
                              target.offset + i * chunk, 1 + i * 31))
    # two big ones so the batch is spread over the workers, not run inline
    reqs.append(write(engine, local, n * chunk, target.segment, target.offset + 4 * MiB, 2 * MiB))
    reqs.append(read(engine, local, n * chunk, target.segment, target.offset + 4 * MiB, 2 * MiB))
    statuses = engine.submit(reqs).wait(30)
    assert len(statuses) == len(reqs)
    for i, (req, st) in enumerate(zip(reqs, statuses, strict=True)):
        if i < n and i not in good:
            assert st.state is State.FAILED, (i, st)
            assert "bounds" in st.reason, (i, st.reason)
            assert st.transferred == 0
        elif i < n:
            assert (st.state, st.transferred) == (State.COMPLETED, req.length), (i, st)
    check = engine.register(bytearray(n * chunk))
    st = run_one(engine, read(engine, check, 0, target.segment, target.offset, n * chunk))
    assert st.state is State.COMPLETED
    for i in good:
        length = 1 + i * 31
        assert bytes(check.view[i * chunk:i * chunk + length]) == \
            bytes(local.view[i * chunk:i * chunk + length]), f"request {i}"


# -- bounds -----------------------------------------------------------------------------------
@pytest.mark.parametrize("op", [Op.READ, Op.WRITE])
def test_remote_out_of_bounds_fails_and_leaves_the_region_intact(engine, target, op) -> None:
    rng = np.random.default_rng(5)
    size, base = target.size, target.offset
    pattern = rand(rng, size)
    src = engine.register(bytearray(pattern))
    st = run_one(engine, write(engine, src, 0, target.segment, base, size))
    assert st.state is State.COMPLETED, st.reason
    local = engine.register(bytearray(b"\x5a" * (2 * MiB)))
    cases = [
        (base + size, 1),  # offset just past the end
        (base + size + 4096, 4096),  # past the end, unaligned size
        (base + size - 10, 20),  # crossing the end
        (base + size - MiB, 2 * MiB),  # crossing the end, multi-slice
        (1 << 40, 4096),  # huge
        ((1 << 64) - 1, 1),  # the largest 64-bit offset
        ((1 << 64) - 100, 200),  # wraps a 64-bit offset
        (1 << 70, 16),  # no 64-bit offset at all
        (-1, 10),  # negative
    ]
    reqs = [TransferRequest(op, local, 0, target.segment, off, n) for off, n in cases]
    statuses = engine.submit(reqs).wait(30)
    for (off, n), st in zip(cases, statuses, strict=True):
        assert st.state is State.FAILED, (off, n, st)
        assert "bounds" in st.reason.lower(), (off, n, st.reason)
    # one at a time too (the inline path), then a valid request on the same connections
    for off, n in cases:
        st = run_one(engine, TransferRequest(op, local, 0, target.segment, off, n))
        assert st.state is State.FAILED and "bounds" in st.reason.lower(), (off, n, st)
    assert bytes(local.view) == b"\x5a" * (2 * MiB), "a refused READ wrote into local memory"
    scratch = engine.register(bytearray(size))
    assert whole(engine, target, scratch) == pattern, "a refused request changed the target"


@pytest.mark.parametrize("op", [Op.READ, Op.WRITE])
def test_local_out_of_bounds_fails_without_touching_anything(engine, target, op) -> None:
    rng = np.random.default_rng(6)
    pattern = rand(rng, MiB)
    src = engine.register(bytearray(pattern))
    assert run_one(engine, write(engine, src, 0, target.segment, target.offset, MiB)).state \
        is State.COMPLETED
    local = engine.register(bytearray(b"\x33" * 4096))
    cases = [(4096, 1), (4000, 200), (0, 4097), (-1, 10), (10, -5), (0, 8 * MiB)]
    statuses = engine.submit([TransferRequest(op, local, loff, target.segment,
                                              target.offset, n) for loff, n in cases]).wait(10)
    for (loff, n), st in zip(cases, statuses, strict=True):
        assert st.state is State.FAILED, (loff, n, st)
        assert "bounds" in st.reason.lower(), st.reason
        assert st.transferred == 0
    assert bytes(local.view) == b"\x33" * 4096
    check = engine.register(bytearray(MiB))
    assert run_one(engine, read(engine, check, 0, target.segment, target.offset, MiB)).state \
        is State.COMPLETED
    assert bytes(check.view) == pattern


# -- memory types -----------------------------------------------------------------------------
def _roundtrip(engine, target, src_obj, dst_obj, toff: int) -> None:
    src = engine.register(src_obj)
    dst = engine.register(dst_obj)
    assert src.length == dst.length > 0
    st = run_one(engine, write(engine, src, 0, target.segment, target.offset + toff, src.length))
    assert st.state is State.COMPLETED, st.reason
    st = run_one(engine, read(engine, dst, 0, target.segment, target.offset + toff, dst.length))
    assert st.state is State.COMPLETED, st.reason
    engine.unregister(src)
    engine.unregister(dst)


def test_register_bytearray(engine, target) -> None:
    data = bytearray(os.urandom(100_003))
    out = bytearray(len(data))
    _roundtrip(engine, target, data, out, 12_345)
    assert out == data


def test_register_numpy_arrays(engine, target) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((257, 33)).astype(np.float32)
    b = np.zeros_like(a)
    _roundtrip(engine, target, a, b, 4097)
    np.testing.assert_array_equal(a, b)
    c = rng.integers(0, 2**63, size=3 * MiB // 8, dtype=np.int64)  # multi-slice
    d = np.empty_like(c)
    _roundtrip(engine, target, c, d, 7)
    np.testing.assert_array_equal(c, d)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_register_cpu_torch_tensors(engine, target, dtype) -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(11)
    dt = getattr(torch, dtype)
    if dt.is_floating_point:
        t = torch.randn(513, 129, generator=gen, dtype=torch.float32).to(dt)
    else:
        t = torch.randint(-128, 127, (513, 129), generator=gen, dtype=dt)
    out = torch.zeros_like(t)
    _roundtrip(engine, target, t, out, 8191)
    assert out.dtype == dt
    assert torch.equal(t, out)


def test_register_refuses_unusable_memory(make_engine) -> None:
    torch = pytest.importorskip("torch")
    eng = make_engine()
    with pytest.raises(TransferError, match="read-only"):
        eng.register(b"immutable bytes")
    with pytest.raises(TransferError, match="read-only"):
        eng.register(memoryview(bytearray(10)).toreadonly())
    with pytest.raises(TransferError, match="contiguous"):
        eng.register(np.zeros((64, 64), dtype=np.float32)[:, ::2])
    with pytest.raises(TransferError, match="contiguous"):
        eng.register(torch.zeros(64, 32).t())
    with pytest.raises(TransferError, match="not a buffer"):
        eng.register("a str is not memory")
    with pytest.raises(TransferError, match="location"):
        eng.register(bytearray(10), location="gpu0")
    assert eng.segment.regions == ()  # nothing half-registered


# -- a target with mixed regions (in process): shm falls back to tcp for non-shm memory --------
def test_mixed_shm_and_plain_regions(transport, make_engine) -> None:
    tgt = make_engine()
    shared = tgt.allocate(2 * MiB)  # shm-backed
    plain = tgt.register(bytearray(MiB))  # a plain buffer: no shm name
    assert shared.shm and plain.shm is None
    eng = make_engine(transport=transport)
    assert eng.transport_for(tgt.name) == transport
    data = os.urandom(MiB + 7)
    src = eng.register(bytearray(data))
    for region in (shared, plain):
        n = min(len(data), region.length - 3)
        st = run_one(eng, write(eng, src, 0, tgt.name, region.base + 3, n))
        assert st.state is State.COMPLETED, st.reason
        assert bytes(region.view[3:3 + n]) == data[:n]
    # a range spanning two adjacent regions is refused: it is not inside one of them
    st = run_one(eng, write(eng, src, 0, tgt.name, shared.base + shared.length - 10, 4096 * 2))
    assert st.state is State.FAILED and "bounds" in st.reason


def test_memory_registered_after_the_first_lookup_is_reachable(transport, make_engine) -> None:
    tgt = make_engine()
    first = tgt.allocate(MiB)
    eng = make_engine(transport=transport)
    data = os.urandom(MiB)
    src = eng.register(bytearray(data))
    assert eng.transfer(Op.WRITE, src, 0, tgt.name, first.base, MiB).state is State.COMPLETED
    later = tgt.allocate(2 * MiB)  # the initiator's cached descriptor does not know it yet
    st = run_one(eng, write(eng, src, 0, tgt.name, later.base + MiB, MiB))
    assert st.state is State.COMPLETED, st.reason
    assert bytes(later.view[MiB:]) == data
    # a range past the new region is still refused whole
    st = run_one(eng, write(eng, src, 0, tgt.name, later.base + MiB + 1, MiB))
    assert st.state is State.FAILED and "bounds" in st.reason
    assert bytes(later.view[MiB:]) == data


def test_unregistered_memory_is_refused(transport, make_engine) -> None:
    tgt = make_engine()
    keep, gone = tgt.allocate(MiB), tgt.allocate(MiB)
    eng = make_engine(transport=transport)
    src = eng.register(bytearray(os.urandom(MiB)))
    for region in (keep, gone):
        assert eng.transfer(Op.WRITE, src, 0, tgt.name, region.base, MiB).state \
            is State.COMPLETED
    tgt.unregister(gone)  # the initiator's descriptor and any mapping still name it
    st = run_one(eng, write(eng, src, 0, tgt.name, gone.base, MiB))
    assert st.state is State.FAILED
    # shm still maps the region and finds its alive page cleared; the others find no
    # region there at the target (nixl's "out of bounds: ... is no longer registered")
    want = "is no longer registered" if transport == "shm" else "out of bounds"
    assert want in st.reason, st.reason
    assert eng.transfer(Op.READ, src, 0, tgt.name, keep.base, MiB).state is State.COMPLETED


def test_a_refreshed_peer_lets_running_batches_finish(transport, make_engine) -> None:
    tgt = make_engine()
    region = tgt.allocate(32 * MiB)
    eng = make_engine(transport=transport)
    data = os.urandom(32 * MiB)
    src = eng.register(bytearray(data))
    batch = eng.submit([write(eng, src, 0, tgt.name, region.base, 32 * MiB)])
    eng._peer(tgt.name).stale = True  # the next lookup replaces the pool under the batch
    eng.transport_for(tgt.name)
    [st] = batch.wait(30)
    assert st.state is State.COMPLETED, st.reason
    assert bytes(region.view) == data


def test_transfer_to_the_engines_own_segment(make_engine) -> None:
    eng = make_engine()
    mine = eng.allocate(MiB)
    assert eng.transport_for(eng.name) == "local"
    data = os.urandom(MiB // 2)
    src = eng.register(bytearray(data))
    assert eng.transfer(Op.WRITE, src, 0, eng.name, mine.base + 5, len(data)).state \
        is State.COMPLETED
    assert bytes(mine.view[5:5 + len(data)]) == data
    st = run_one(eng, write(eng, src, 0, eng.name, mine.base + MiB - 10, 20))
    assert st.state is State.FAILED and "bounds" in st.reason
    assert bytes(mine.view[MiB - 10:]) == bytes(10)


# -- failures: a dead target, a wrong secret --------------------------------------------------
TIMEOUT = 3.0


def test_target_killed_mid_batch_fails_within_the_timeout(transport, spawn_target,
                                                          make_engine) -> None:
    t = spawn_target(64 * MiB)
    eng = make_engine(transport=transport, timeout=TIMEOUT)
    local = eng.allocate(64 * MiB, shared=False)
    assert eng.transfer(Op.WRITE, local, 0, t.segment, t.offset, MiB).state is State.COMPLETED
    assert eng.transport_for(t.segment) == transport

    os.kill(t.pid, signal.SIGSTOP)  # freeze it so the batch is certainly in flight over sockets
    half = 32 * MiB
    reqs = [write(eng, local, o, t.segment, t.offset + o, 4 * MiB) for o in range(0, half, 4 * MiB)]
    reqs += [read(eng, local, o, t.segment, t.offset + o, 4 * MiB)
             for o in range(half, 64 * MiB, 4 * MiB)]
    batch = eng.submit(reqs)
    in_flight = not batch.done
    t.kill()
    t0 = time.monotonic()
    statuses = batch.wait(timeout=2 * TIMEOUT + 2)
    elapsed = time.monotonic() - t0
    assert all(s.state is not State.PENDING for s in statuses), statuses
    assert elapsed < 2 * TIMEOUT + 1
    if in_flight:
        assert any(s.state is State.FAILED for s in statuses), statuses
    for s in statuses:
        if s.state is State.FAILED:
            assert s.reason
    # the dead target is noticed quickly from now on
    t1 = time.monotonic()
    statuses = eng.submit([write(eng, local, 0, t.segment, t.offset, 4096),
                           read(eng, local, 0, t.segment, t.offset, 2 * MiB)]).wait(2 * TIMEOUT)
    assert [s.state for s in statuses] == [State.FAILED, State.FAILED], statuses
    assert time.monotonic() - t1 < TIMEOUT
    assert all(s.reason for s in statuses)
    with pytest.raises(TransferError):
        eng.transfer(Op.READ, local, 0, t.segment, t.offset, 4096, timeout=2 * TIMEOUT)


def test_target_killed_while_batches_stream(transport, spawn_target, make_engine) -> None:
    """No freezing: batches keep flowing while the target is SIGKILLed; they end in FAILED."""
    t = spawn_target(16 * MiB)
    eng = make_engine(transport=transport, timeout=TIMEOUT)
    local = eng.allocate(16 * MiB, shared=False)
    results: list[tuple[float, list]] = []
    stop = threading.Event()
    done_before_kill = threading.Event()

    def stream() -> None:
        while not stop.is_set():
            reqs = [write(eng, local, o, t.segment, t.offset + o, MiB)
                    for o in range(0, 8 * MiB, MiB)]
            reqs += [read(eng, local, o, t.segment, t.offset + o, MiB)
                     for o in range(8 * MiB, 16 * MiB, MiB)]
            statuses = eng.submit(reqs).wait(timeout=2 * TIMEOUT + 2)
            results.append((time.monotonic(), statuses))
            if len(results) >= 3:
                done_before_kill.set()
            if any(s.state is not State.COMPLETED for s in statuses):
                return

    th = threading.Thread(target=stream)
    th.start()
    try:
        assert done_before_kill.wait(30), "no batch completed before the kill"
        t.kill()
        killed_at = time.monotonic()
        th.join(4 * TIMEOUT)
        assert not th.is_alive(), "batches kept hanging after the target died"
    finally:
        stop.set()
        th.join(30)
    for _, statuses in results:
        assert all(s.state is not State.PENDING for s in statuses), statuses
    last_at, last = results[-1]
    assert any(s.state is State.FAILED for s in last)
    assert last_at - killed_at < 2 * TIMEOUT + 2
    assert all(s.state is State.COMPLETED for _, st in results[:3] for s in st)


@pytest.mark.parametrize("metadata", ["p2p", "http"])
def test_wrong_secret_is_refused(transport, metadata, spawn_target, make_engine,
                                 metadata_server) -> None:
    url = metadata_server.url if metadata == "http" else "p2p"
    t = spawn_target(4 * MiB, secret="correct horse", metadata=url)
    for secret in ("battery staple", ""):
        eng = make_engine(transport=transport, secret=secret, metadata=url, timeout=TIMEOUT)
        local = eng.register(bytearray(b"\x11" * 4096))
        statuses = eng.submit([write(eng, local, 0, t.segment, t.offset, 4096),
                               read(eng, local, 0, t.segment, t.offset, 4096)]).wait(10)
        for st in statuses:
            assert st.state is State.FAILED, (secret, st)
            assert "secret" in st.reason, st.reason
        assert bytes(local.view) == b"\x11" * 4096
    good = make_engine(transport=transport, secret="correct horse", metadata=url)
    assert good.transport_for(t.segment) == transport
    data = os.urandom(4096)
    src, dst = good.register(bytearray(data)), good.register(bytearray(b"\xff" * 4096))
    # the refused initiators wrote nothing: the target's buffer is still all zeros
    assert good.transfer(Op.READ, dst, 0, t.segment, t.offset, 4096).state is State.COMPLETED
    assert bytes(dst.view) == bytes(4096)
    assert good.transfer(Op.WRITE, src, 0, t.segment, t.offset, 4096).state is State.COMPLETED
    assert good.transfer(Op.READ, dst, 0, t.segment, t.offset, 4096).state is State.COMPLETED
    assert bytes(dst.view) == data
