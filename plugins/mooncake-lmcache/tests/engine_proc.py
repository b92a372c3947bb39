"""An LMCache engine in a process of its own, for the cross-process test: stores or retrieves
`--tokens` tokens of seeded KV through the plugin and prints one JSON line.

    python engine_proc.py --master HOST:PORT store --tokens 600 --seed 8
    python engine_proc.py --master HOST:PORT retrieve --tokens 600 --seed 8
        -> {"hit": 600, "retrieved": 600, "same": true}
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from mooncake_lmcache import harness as h

LAYOUT = h.KVLayout(num_layers=4, num_heads=2, head_size=64)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", required=True)
    ap.add_argument("mode", choices=["store", "retrieve"])
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    args = ap.parse_args()
    toks, kv = h.tokens(args.tokens, args.seed), LAYOUT.random(args.tokens, args.seed)
    engine = h.build(args.mode, LAYOUT, h.mooncake_config(args.master))
    try:
        if args.mode == "store":
            engine.store(toks, kvcaches=kv)
            h.remote_only(engine)  # returns once every chunk's put has finished
            out: dict[str, object] = {"stored": True}
        else:
            hit = engine.lookup(toks)
            got = LAYOUT.empty(args.tokens)
            mask = engine.retrieve(toks, kvcaches=got)
            out = {"hit": hit, "retrieved": int(mask.sum()),
                   "same": torch.equal(got.view(torch.int16), kv.view(torch.int16))}
    finally:
        h.destroy(engine)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
