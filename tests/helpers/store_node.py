"""A store client in its own process, for tests: contributes a segment, then obeys JSON commands
on stdin, one per line, answering one JSON line each; exits at EOF.

    {"cmd": "put", "key": K, "size": N, "seed": S, "replicas": R, "preferred": SEG}
    {"cmd": "get", "key": K, "size": N, "seed": S}   -> {"ok": true, "match": bool}
    {"cmd": "held"}   -> {"ok": true, "keys": [...]}: what its segment holds, as far as it knows
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from mooncake_cli.config import TransferConfig
from mooncake_cli.registry import Registry
from mooncake_cli.store import ReplicateConfig, StoreError
from mooncake_cli.store.client import StoreClient
from mooncake_cli.transfer.engine import TransferEngine


def value(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", required=True)
    ap.add_argument("--segment-size", type=int, default=8 << 20)
    ap.add_argument("--secret")
    args = ap.parse_args()
    engine = TransferEngine(TransferConfig(timeout=3), Registry())
    client = StoreClient(args.master, engine, args.segment_size, secret=args.secret, timeout=3)
    print(json.dumps({"event": "ready", "segment": engine.name,
                      "client_id": client.owner.client_id}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "put":
                cfg = ReplicateConfig(cmd.get("replicas", 1), cmd.get("preferred", ""))
                client.put(cmd["key"], value(cmd["seed"], cmd["size"]), cfg)
                out: dict[str, object] = {"ok": True}
            elif cmd["cmd"] == "held":
                out = {"ok": True, "keys": client.owner.holdings.keys()}
            else:
                got = client.get(cmd["key"])
                out = {"ok": True, "match": got == value(cmd["seed"], cmd["size"])}
        except StoreError as e:
            out = {"ok": False, "code": int(e.code), "message": str(e)}
        print(json.dumps(out), flush=True)
    client.close()
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
