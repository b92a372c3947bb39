"""A KV event publisher in its own process, as vLLM 0.32's `ZmqEventPublisher` is: a PUB
socket and a ROUTER replay socket, batches encoded by msgspec from copies of vLLM's structs
(`vllm/distributed/kv_events.py`), frames (topic, seq as 8 bytes big-endian, payload), a replay
buffer answered as vLLM answers it. The PUB is an XPUB (the same wire to a subscriber) so the
test can wait until the conductor has subscribed instead of sleeping.

    pub = Publisher(pub_port, replay_port)        # python -m tests.helpers.kv_publisher
    pub.wait_subscribers(1)
    pub.publish([stored(...)])                    # -> its sequence number
    pub.publish([...], live=False)                # buffered for replay only (a lost batch)
    pub.raw([b"x"])                               # any frames (malformed ones)
    pub.close()
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from collections import deque
from typing import Any

import msgspec
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# -- the test's side: events as JSON, hashes as ints or "b:HEX" (vLLM's default: bytes) ------
def stored(hashes: list[Any], tokens: list[int], block_size: int, parent: Any = None,
           medium: str | None = "GPU", lora_name: str | None = None,
           extra_keys: list[Any] | None = None) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": block_size, "medium": medium,
            "lora_name": lora_name, "extra_keys": extra_keys}


def removed(hashes: list[Any], medium: str | None = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


class Publisher:
    def __init__(self, pub_port: int, replay_port: int | None) -> None:
        cmd = [sys.executable, "-m", "tests.helpers.kv_publisher", str(pub_port),
               str(replay_port or 0)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.pub = f"tcp://127.0.0.1:{pub_port}"
        self.replay = f"tcp://127.0.0.1:{replay_port}" if replay_port else None
        assert self._line(30.0) == {"ready": True}

    def _line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        out = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout
            while not out.endswith(b"\n") and time.monotonic() < deadline:
                if sel.select(max(0.0, deadline - time.monotonic())):
                    chunk = self.proc.stdout.read1(1)  # type: ignore[attr-defined]
                    if not chunk:
                        break
                    out += chunk
        assert out.endswith(b"\n"), f"publisher said {out!r} within {timeout} s"
        return dict(json.loads(out))

    def _ask(self, cmd: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd).encode() + b"\n")
        self.proc.stdin.flush()
        return self._line(timeout)

    def wait_subscribers(self, n: int, timeout: float = 30.0) -> None:
        assert self._ask({"op": "wait_subs", "n": n, "timeout": timeout}, timeout + 5)["subs"] >= n

    def publish(self, events: list[dict[str, Any]], live: bool = True,
                dp_rank: int | None = 0) -> int:
        return int(self._ask({"op": "publish", "events": events, "live": live,
                              "dp_rank": dp_rank})["seq"])

    def raw(self, frames: list[bytes]) -> None:
        self._ask({"op": "raw", "frames": [f.hex() for f in frames]})

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


# -- the publisher process --------------------------------------------------------------------
def _hash(h: Any) -> bytes | int:
    return bytes.fromhex(h[2:]) if isinstance(h, str) and h.startswith("b:") else int(h)


def _event(e: dict[str, Any]) -> BlockStored | BlockRemoved | AllBlocksCleared:
    kind = e.pop("type")
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    e["block_hashes"] = [_hash(h) for h in e["block_hashes"]]
    if kind == "BlockRemoved":
        return BlockRemoved(**e)
    if e.get("parent_block_hash") is not None:
        e["parent_block_hash"] = _hash(e["parent_block_hash"])
    if e.get("extra_keys") is not None:
        e["extra_keys"] = [tuple(x) if x is not None else None for x in e["extra_keys"]]
    return BlockStored(lora_id=None, **e)


def main(pub_port: int, replay_port: int) -> None:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.XPUB_VERBOSE, 1)
    pub.bind(f"tcp://127.0.0.1:{pub_port}")
    replay = ctx.socket(zmq.ROUTER) if replay_port else None
    if replay is not None:
        replay.bind(f"tcp://127.0.0.1:{replay_port}")
    encoder, seq, subs = msgspec.msgpack.Encoder(), 0, 0
    buffer: deque[tuple[int, bytes]] = deque(maxlen=10_000)
    poller = zmq.Poller()
    poller.register(pub, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    if replay is not None:
        poller.register(replay, zmq.POLLIN)
    waiting: tuple[int, float] | None = None  # (subscribers, deadline) of a wait_subs
    pending = b""
    print(json.dumps({"ready": True}), flush=True)
    while True:
        ready = dict(poller.poll(50))
        if pub in ready:
            if pub.recv()[:1] == b"\x01":
                subs += 1
        if replay is not None and replay in ready:  # as vLLM's _service_replay
            client, _, start = replay.recv_multipart()
            for s, payload in buffer:
                if s >= int.from_bytes(start, "big"):
                    replay.send_multipart((client, b"", b"", s.to_bytes(8, "big"), payload))
            replay.send_multipart((client, b"", b"", END_SEQ, b""))
        if waiting is not None and (subs >= waiting[0] or time.monotonic() > waiting[1]):
            print(json.dumps({"subs": subs}), flush=True)
            waiting = None
        if sys.stdin.fileno() not in ready:
            continue
        chunk = os.read(sys.stdin.fileno(), 1 << 20)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            cmd = json.loads(line)
            if cmd["op"] == "wait_subs":
                waiting = (cmd["n"], time.monotonic() + cmd["timeout"])
            elif cmd["op"] == "raw":
                pub.send_multipart([bytes.fromhex(f) for f in cmd["frames"]])
                print(json.dumps({"ok": True}), flush=True)
            elif cmd["op"] == "publish":
                batch = KVEventBatch(ts=time.time(), events=[_event(e) for e in cmd["events"]],
                                     data_parallel_rank=cmd["dp_rank"])
                payload = encoder.encode(batch)
                if cmd["live"]:
                    pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))
                buffer.append((seq, payload))
                print(json.dumps({"seq": seq}), flush=True)
                seq += 1


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
