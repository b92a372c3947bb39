"""A store client on one testbed host (run inside its namespace: `ip netns exec NS python3 -m
tests.helpers.testbed_store MASTER`, its address in MOONCAKE_TESTBED_ADDR, the cluster secret in
MOONCAKE_SECRET), for tests/integration/test_testbed_store.py. It contributes a DRAM segment, prints
{"event": "ready", "segment"}, then obeys JSON commands on stdin, one per line:

    {"cmd": "put", "keys": [...], "size": N}  -> {"ok": true}: each value is `value(key, N)`,
        its one replica in this client's own segment
    {"cmd": "get", "keys": [...]}             -> {"ok": true, "good": [...], "replicas": {...},
        "read_from": {segment: bytes}}: the keys whose bytes came back right, the segment
        holding each, and what this client's transfer engine read from each other segment

The transfer engine uses tcp (a same-machine peer would otherwise be read over shared memory).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

from mooncake_cli.config import TransferConfig
from mooncake_cli.registry import Registry
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.records import ReplicateConfig
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.linkstats import reads_since


def value(key: str, size: int) -> bytes:
    """The bytes a put of `key` stores: a hash chain, so a wrong or mixed-up read shows."""
    out, block = bytearray(), key.encode()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:size])


def main(master: str) -> int:
    addr, secret = os.environ["MOONCAKE_TESTBED_ADDR"], os.environ["MOONCAKE_SECRET"]
    engine = TransferEngine(TransferConfig(host=addr, transport="tcp", secret=secret),
                            Registry.from_env())
    client = StoreClient(master, engine, 32 << 20, secret=secret, timeout=30)
    own = ReplicateConfig(preferred_segment=engine.name)
    print(json.dumps({"event": "ready", "segment": engine.name}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        keys: list[str] = cmd["keys"]
        if cmd["cmd"] == "put":
            errors = client.batch_put(keys, [value(k, cmd["size"]) for k in keys], own)
            out: dict[str, object] = {"ok": all(e is None for e in errors)}
        else:
            before = engine.links.snapshot()
            got = client.batch_get(keys)
            read = reads_since(before, engine.links.snapshot())
            out = {"ok": True,
                   "good": [k for k, v in zip(keys, got, strict=True)
                            if isinstance(v, bytes) and v == value(k, len(v)) and v],
                   "replicas": {m.key: [r.segment for r in m.replicas]
                                for m in client.batch_describe(keys)
                                if not isinstance(m, Exception)},
                   "read_from": {peer: t.bytes for peer, t in read.items()}}
        print(json.dumps(out), flush=True)
    client.close()
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
