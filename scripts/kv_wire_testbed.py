"""TTFT of prompts whose prefix sits in the store, int8 against native KV on a shaped link.

Needs root. Makes a 2-host testbed (prefix `kvw`, link a-b at --rate), then per wire: a store
master and a prefill worker on a, a decode worker on b (both --dtype bfloat16, --kv-wire WIRE);
each of --prompts prompts (~--tokens tokens of this repository's docs, each its own) is
prefilled once without a decode worker (its blocks go to the store) and then timed with the
decode worker on b: the prefill loads all but the last block from the store, computes the
rest and streams every block over the link before it answers, so its answer time is the TTFT.
One JSON line per wire: median and mean TTFT, the prefill's transfer seconds, bytes sent.

    python3 scripts/kv_wire_testbed.py --rate 1gbit --prompts 6 --tokens 2048
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from mooncake_cli.testbed import roles

REPO = Path(__file__).resolve().parents[1]
TB = [sys.executable, "-m", "mooncake_cli", "bench", "testbed"]
spawn = partial(roles.spawn, "kvw")  # a mooncake role in a host of this testbed
A, B = "10.77.0.1", "10.77.0.2"


def client(args: argparse.Namespace) -> None:
    """Inside host a: the timed requests."""
    from mooncake_cli.http.auth import signer
    from mooncake_cli.http.jsonhttp import call

    auth = signer(os.environ["MOONCAKE_SECRET"])
    words = " ".join((REPO / d).read_text() for d in ("README.md", "docs/architecture.md"))
    words_l = words.split(" ")
    prefill, decode = f"http://{A}:9100", f"http://{B}:9200"
    ttft, transfer, sent0 = [], [], None
    for i in range(args.prompts):
        text = f"Document {i}: " + " ".join(words_l[i * 40:i * 40 + int(args.tokens * 0.62)])
        body: dict[str, Any] = {"request_id": f"prime-{i}", "prompt": text,
                                "sampling": {"max_tokens": 1, "temperature": 0}}
        assert call(prefill + "/v1/prefill", body, timeout=600, auth=auth).status == 200
        body.update(request_id=f"timed-{i}", decode=decode)
        t = time.perf_counter()
        ans = call(prefill + "/v1/prefill", body, timeout=600, auth=auth)
        ttft.append(time.perf_counter() - t)
        assert ans.status == 200, ans.body
        transfer.append(ans.body["timing"]["transfer"])
        call(decode + "/v1/kv/release", {"request_id": f"timed-{i}"}, auth=auth)
        sent0 = sent0 or ans.body
    print(json.dumps({"ttft_median_s": statistics.median(ttft),
                      "ttft_mean_s": statistics.mean(ttft),
                      "transfer_median_s": statistics.median(transfer), "ttft_s": ttft,
                      "prompt_tokens": sent0["prompt_tokens"] if sent0 else 0,
                      "cached_tokens": sent0["cached_tokens"] if sent0 else 0}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--wires", default="native,int8")
    ap.add_argument("--client", action="store_true")
    args = ap.parse_args()
    if args.client:
        return client(args)
    os.environ.setdefault("MOONCAKE_SECRET", secrets.token_hex(16))
    subprocess.run([*TB, "up", "--prefix", "kvw", "--hosts", "2", "--links", f"a-b={args.rate}"],
                   check=True, stdout=subprocess.DEVNULL)
    try:
        for wire in args.wires.split(","):
            common = ["--model", "smollm2-135m", "--dtype", "bfloat16", "--kv-wire", wire,
                      "--kv-blocks", "256", "--threads", "1"]
            procs = [spawn("a", "store", "master", "--host", A, "--port", "50051")]
            try:
                roles.ready(procs[0])
                procs.append(spawn("a", "prefill", *common, "--listen", f"{A}:9100",
                                   "--store", f"{A}:50051", "--segment-size", "2GiB"))
                procs.append(spawn("b", "decode", *common, "--listen", f"{B}:9200",
                                   "--kv-blocks", "1024"))  # a requester may hold half
                for p in procs[1:]:
                    roles.ready(p)
                rep = roles.run("kvw", "a", sys.executable, __file__, "--client", "--prompts",
                                str(args.prompts), "--tokens", str(args.tokens))
                print(json.dumps({"wire": wire, "rate": args.rate, "utc": time.strftime(
                    "%Y-%m-%d %H:%M:%S", time.gmtime()), "load_average": os.getloadavg(),
                                  **rep}), flush=True)
            finally:
                for p in reversed(procs):
                    p.terminate()
                    p.wait(60)
    finally:
        subprocess.run([*TB, "down", "--prefix", "kvw"], stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
