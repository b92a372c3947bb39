"""Write capabilities: a decode worker's KV pool takes a WRITE only with the capability of a
reservation covering those bytes. Real worker processes with a cluster secret; the attacker is
a fake decode server that the prefill worker is pointed at, naming the real worker's blocks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mooncake_cli.config import TransferConfig
from mooncake_cli.http.auth import signer
from mooncake_cli.http.jsonhttp import call, events
from mooncake_cli.http.server import Server, edge_app
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.batch import Op, State, TransferRequest
from mooncake_cli.transfer.engine import TransferEngine
from tests.conftest import wait_for
from tests.helpers.procs import jsonl
from tests.helpers.tiny_models import write_model
from tests.helpers.worker_procs import WorkerProc

pytestmark = pytest.mark.timeout(180)
SECRET = "capability-test-secret"
AUTH = signer(SECRET)
PROMPT = [0, 17, 29, 41, 53, 67, 79, 83, 97, 101, 113, 127, 131, 139, 149, 151, 163]


AUDIT: list[str] = []  # the decode worker's audit log


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    model = write_model(tmp_path_factory.mktemp("ckpt") / "tiny-llama", "llama", seed=5)
    common = ["--model", str(model), "--store", "none", "--block-size", "8",
              "--secret", SECRET]
    AUDIT.append(str(tmp_path_factory.mktemp("audit") / "decode.jsonl"))
    procs = [WorkerProc("prefill", *common, "--name", "p-cap"),
             WorkerProc("decode", *common, "--kv-blocks", "32", "--name", "d-cap",
                        "--audit-log", AUDIT[0])]
    try:
        yield procs[0].url, procs[1].url
    finally:
        for p in procs:
            p.stop()


@pytest.fixture
def reader() -> Iterator[TransferEngine]:
    eng = TransferEngine(TransferConfig(secret=SECRET), Registry())
    yield eng
    eng.close()


def reserve(decode: str, rid: str, tokens: int = len(PROMPT)) -> dict[str, Any]:
    got = call(decode + "/v1/kv/reserve", {"request_id": rid, "num_tokens": tokens}, auth=AUTH)
    assert got.status == 200, got.body
    return dict(got.body)


def release(decode: str, rid: str) -> None:
    call(decode + "/v1/kv/release", {"request_id": rid}, auth=AUTH)


def blocks(eng: TransferEngine, r: dict[str, Any]) -> list[bytes]:
    """The bytes of each block of reservation `r`, read from the decode worker."""
    bb = r["block_bytes"]
    out = []
    for b in r["block_ids"]:
        local = eng.register(bytearray(bb))
        eng.transfer(Op.READ, local, 0, r["segment"], r["base"] + b * bb, bb)
        assert local.view is not None
        out.append(bytes(local.view))
        eng.unregister(local)
    return out


def fake_decode(answer: dict[str, Any]) -> Server:
    """An HTTP server a prefill worker can be pointed at: it answers every reservation with
    `answer` (another worker's segment and blocks)."""

    async def reserve(request: Request) -> JSONResponse:
        return JSONResponse(answer)

    async def release(request: Request) -> JSONResponse:
        return JSONResponse({"request_id": "x", "released_blocks": 0})

    return Server(edge_app([Route("/v1/kv/reserve", reserve, methods=["POST"]),
                            Route("/v1/kv/release", release, methods=["POST"])]),
                  "127.0.0.1", 0, "fake-decode").start()


@pytest.mark.parametrize("capability", ["none", "made-up", "another reservation's"])
def test_a_prefill_pointed_at_a_fake_decode_cannot_write_the_real_ones_blocks(
        workers: tuple[str, str], reader: TransferEngine, capability: str) -> None:
    prefill, decode = workers
    victim = reserve(decode, f"victim-{capability}")  # a real request's KV, being written
    before = blocks(reader, victim)
    answer = {k: victim[k] for k in ("segment", "engine", "block_ids", "block_bytes", "base")}
    if capability == "made-up":
        answer["capability"] = "ab" * 16
    elif capability == "another reservation's":  # the attacker's own, real, for other blocks
        answer["capability"] = reserve(decode, f"attacker-{capability}")["capability"]
    fake = fake_decode(answer)
    try:
        got = call(prefill + "/v1/prefill", {"request_id": f"evil-{capability}",
                                             "token_ids": PROMPT,
                                             "decode": f"http://127.0.0.1:{fake.port}"},
                   timeout=60, auth=AUTH)
    finally:
        fake.close()
    assert got.status >= 400, got.body  # the prefill says its KV could not be written
    assert "capability" in got.body["error"]["message"], got.body
    assert blocks(reader, victim) == before  # not one byte of the victim's blocks changed
    release(decode, f"victim-{capability}")
    release(decode, f"attacker-{capability}")


def test_writes_need_a_capability_covering_them(workers: tuple[str, str],
                                                reader: TransferEngine) -> None:
    _, decode = workers
    r = reserve(decode, "direct", tokens=8)
    other = reserve(decode, "other", tokens=8)
    bb, cap = r["block_bytes"], bytes.fromhex(r["capability"])
    src = reader.register(bytearray(b"\x5a" * bb))
    mine = r["base"] + r["block_ids"][0] * bb
    theirs = other["base"] + other["block_ids"][0] * bb

    def write(offset: int, capability: bytes | None) -> str:
        [st] = reader.submit([TransferRequest(Op.WRITE, src, 0, r["segment"], offset, bb,
                                              capability)]).wait(10)
        return "ok" if st.state is State.COMPLETED else st.reason

    assert "guarded" in write(mine, None)
    assert "does not cover" in write(theirs, cap)
    assert "unknown or revoked" in write(mine, b"\x01" * 16)
    assert write(mine, cap) == "ok"
    assert blocks(reader, r)[0] == b"\x5a" * bb
    release(decode, "direct")
    assert "unknown or revoked" in write(mine, cap)  # released: the capability died with it
    release(decode, "other")


def test_a_real_hand_off_still_works(workers: tuple[str, str]) -> None:
    prefill, decode = workers
    got = call(prefill + "/v1/prefill", {"request_id": "legit", "token_ids": PROMPT,
                                         "decode": decode, "sampling": {"max_tokens": 4}},
               timeout=60, auth=AUTH)
    assert got.status == 200, got.body
    out = [e["token"] for e in events(decode + "/v1/generate", {
        "request_id": "legit", "token_ids": PROMPT, "first_token": got.body["first_token"],
        "sampling": {"max_tokens": 4}}, timeout=60, auth=AUTH) if "token" in e]
    assert len(out) == 4 and out[0] == got.body["first_token"]


def test_the_audit_log_has_the_refused_writes_and_the_transfers(
        workers: tuple[str, str], reader: TransferEngine) -> None:
    r = reserve(workers[1], "audited")
    src = reader.register(bytearray(r["block_bytes"]))
    [st] = reader.submit([TransferRequest(Op.WRITE, src, 0, r["segment"], r["base"],
                                          r["block_bytes"])]).wait(10)
    assert st.state is State.FAILED
    release(workers[1], "audited")

    def refused() -> list[dict[str, Any]]:
        return [x for x in jsonl(AUDIT[0])
                if x["event"] == "refused" and x.get("listener") == "transfer"]

    wait_for(lambda: any("guarded" in x["why"] and x["peer"] for x in refused())
             and any(x["event"] == "reserve" for x in jsonl(AUDIT[0])), 10,
             what="the reservation and the refused write in the decode worker's audit log")


def test_unused_reservations_are_bounded_per_requester_and_expire(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Reserving every block and never writing: one requester holds at most half the pool in
    unused reservations, and those are freed after UNUSED_TTL (here 1 s, 30 s by default)."""
    from mooncake_cli.config.worker import WorkerConfig
    from mooncake_cli.worker import kvgrant
    from mooncake_cli.worker.decode import DecodeWorker

    monkeypatch.setattr(kvgrant, "UNUSED_TTL", 1.0)
    with DecodeWorker(WorkerConfig(role="decode", block_size=8, kv_blocks=16)) as decode:
        got = [call(decode.url + "/v1/kv/reserve", {"request_id": f"hog-{i}", "num_tokens": 16})
               for i in range(8)]
        assert [a.status for a in got] == [200] * 4 + [503] * 4  # 2 blocks each, 8 of 16
        assert "not written to" in got[4].body["error"]["message"]
        time.sleep(1.5)  # sleep: behaviour - UNUSED_TTL (1 s) runs out
        again = call(decode.url + "/v1/kv/reserve", {"request_id": "late", "num_tokens": 16})
        assert again.status == 200, again.body  # the unused ones were freed first
        assert decode.load()["free_blocks"] == 16 - 2
