"""A real prefill worker on one testbed host, for tests/integration/test_testbed_fetch.py (run
inside the host's namespace: `ip netns exec NS python3 -m tests.helpers.link_worker ...`, its
address in MOONCAKE_TESTBED_ADDR, the cluster secret in MOONCAKE_SECRET):

- `hold`: the store master and a worker that prefills PROMPT_TOKENS tokens, storing their
  blocks in its own segment; prints {"master", "segment", "answer"}, then serves until stdin
  closes.
- `fetch MASTER`: a worker that prefills the same prompt reusing blocks from any segment (as
  a worker does when the conductor has it fetch); prints its answer, whose `fetched` says what
  its transfer engine read from the holder's segment and how long it took.
- `prefetch MASTER`: a worker asked to prefetch the prompt first (as the conductor asks while
  the request waits); once the prefetch is done it prefills; prints the prefetch's report and
  the answer.

The transfer engine uses tcp, so the bytes cross the shaped link (a same-machine peer would
otherwise be reached over shared memory).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from mooncake_cli.config import TransferConfig
from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.http.jsonhttp import call
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.service import MasterService
from mooncake_cli.worker.prefill import PrefillWorker

BLOCK = 64  # tokens per block: 128 KiB of the demo model's KV
PROMPT_TOKENS = 16 * BLOCK + 5  # 16 full blocks, 2 MiB


def prompt() -> list[int]:
    return [256, *((i * 7 + 3) % 256 for i in range(PROMPT_TOKENS - 1))]


def worker(name: str, store: str) -> PrefillWorker:
    addr, secret = os.environ["MOONCAKE_TESTBED_ADDR"], os.environ["MOONCAKE_SECRET"]
    cfg = WorkerConfig(role="prefill", store=store, segment_size=64 << 20, block_size=BLOCK,
                       kv_blocks=64, chunk_size=512, listen=f"{addr}:0", name=name, threads=1)
    return PrefillWorker(cfg, dataclasses.replace(TransferConfig(), host=addr,
                                                  transport="tcp", secret=secret))


def prefill(w: PrefillWorker, rid: str, reuse: str) -> dict[str, object]:
    done = call(w.url + "/v1/prefill", {"request_id": rid, "token_ids": prompt(),
                                        "reuse": reuse, "sampling": {"max_tokens": 1}},
                timeout=120, auth=w.auth)
    if done.status != 200:
        raise SystemExit(f"prefill {rid} failed: {done.status} {done.body}")
    return dict(done.body)


def main(argv: list[str]) -> None:
    addr, secret = os.environ["MOONCAKE_TESTBED_ADDR"], os.environ["MOONCAKE_SECRET"]
    if argv[0] == "hold":
        with MasterService(StoreMaster(), addr, 0, secret=secret) as master:
            w = worker("holder", master.address)
            with w:
                answer = prefill(w, "hold", "local")
                assert w.store is not None
                print(json.dumps({"master": master.address, "segment": w.store.engine.name,
                                  "answer": answer}), flush=True)
                sys.stdin.read()  # serve the blocks until the test is done
    elif argv[0] == "prefetch":
        with worker(os.environ["MOONCAKE_TESTBED_HOST"], argv[1]) as w:
            asked = call(w.url + "/v1/prefetch", {"request_id": "p", "token_ids": prompt()},
                         timeout=60, auth=w.auth)
            assert asked.status == 200 and asked.body["started"], asked.body
            assert w.prefetch is not None
            pull = w.prefetch.get("p")
            assert pull is not None and pull.finished.wait(120), "the prefetch did not end"
            report = pull.report()
            print(json.dumps({"prefetch": report, "answer": prefill(w, "p", "any")}), flush=True)
    else:
        w = worker(os.environ["MOONCAKE_TESTBED_HOST"], argv[1])
        with w:
            print(json.dumps(prefill(w, "fetch", "any")), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
