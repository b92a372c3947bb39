"""A store client in its own process for the store-events tests: contributes a DRAM segment
(and an SSD tier with --ssd-dir), then obeys JSON commands on stdin, one per line, answering
one JSON line each; exits at EOF (unmounting) or is killed (the master then loses its
replicas when its client TTL runs out).

    {"cmd": "blocks", "tokens": [...], "ns": {KVNamespace fields}, "size": N}
        -> {"ok": true, "keys": [...]}: one object per full block of tokens, our block keys
    {"cmd": "put", "key": K, "size": N}      -> {"ok": true}
    {"cmd": "remove", "key": K}              -> {"ok": true}
    {"cmd": "tiers", "keys": [...]}          -> {"ok": true, "tiers": [[tier, ...] per key]}:
        the tiers ("dram", "ssd") of each key's complete replicas, as the master says
"""

from __future__ import annotations

import argparse
import json
import sys

from mooncake_cli.config import TransferConfig
from mooncake_cli.kvkeys import KVNamespace, block_keys
from mooncake_cli.registry import Registry
from mooncake_cli.store import StoreError
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.records import ReplicaStatus
from mooncake_cli.transfer.engine import TransferEngine


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", required=True)
    ap.add_argument("--segment-size", type=int, default=8 << 20)
    ap.add_argument("--ssd-dir")
    ap.add_argument("--ssd-size", type=int, default=0)
    args = ap.parse_args()
    engine = TransferEngine(TransferConfig(timeout=3), Registry())
    client = StoreClient(args.master, engine, args.segment_size, timeout=3,
                         ssd_dir=args.ssd_dir, ssd_size=args.ssd_size)
    print(json.dumps({"event": "ready", "segment": engine.name}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        out: dict[str, object] = {"ok": True}
        try:
            if cmd["cmd"] == "blocks":
                keys = block_keys(cmd["tokens"], KVNamespace(**cmd["ns"]))
                for key in keys:
                    client.put(key, bytes(cmd["size"]))
                out["keys"] = keys
            elif cmd["cmd"] == "put":
                client.put(cmd["key"], bytes(cmd["size"]))
            elif cmd["cmd"] == "tiers":
                out["tiers"] = [[] if isinstance(meta, StoreError) else sorted(
                    {r.tier for r in meta.replicas if r.status == ReplicaStatus.COMPLETE})
                    for meta in client.batch_describe(cmd["keys"])]
            else:
                client.remove(cmd["key"])
        except StoreError as e:
            out = {"ok": False, "code": int(e.code), "message": str(e)}
        print(json.dumps(out), flush=True)
    client.close()
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
