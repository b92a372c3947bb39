#!/usr/bin/env python3
"""What signing costs a request between the roles: the same edge with and without the secret.

    python scripts/bench_auth.py --requests 3000 --body 4096

One edge `Server` in this process answering POST /v1/x (the body read through the
edge, as a worker reads /v1/prefill); the pooled sync client sends `--requests` requests one
after another, unsigned to a server without a secret, then signed to one with it, alternating
rounds. Prints the CPU time per request (client and server, this process: less sensitive to
other load on a shared host than wall time) of each, the best round of each, and the ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

from mooncake_cli.http import jsonhttp  # noqa: E402
from mooncake_cli.http.auth import Gate, Signer  # noqa: E402
from mooncake_cli.http.server import Server, body, edge_app  # noqa: E402


async def echo(request: Request) -> Response:
    return JSONResponse({"n": len(await body(request))})


def cpu_per_request(url: str, payload: dict[str, str], n: int, auth: Signer | None) -> float:
    """CPU seconds of this process (client and server together) per request."""
    t = time.process_time()
    for _ in range(n):
        assert jsonhttp.call(url, payload, auth=auth).status == 200
    return (time.process_time() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--body", type=int, default=4096, help="bytes of each request's body")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    payload = {"pad": "x" * args.body}
    plain = Server(edge_app([Route("/v1/x", echo, methods=["POST"])], guard=Gate("")),
                   "127.0.0.1", 0, "plain").start()  # as a role without a secret
    secret = "bench-secret"
    signed = Server(edge_app([Route("/v1/x", echo, methods=["POST"])], guard=Gate(secret)),
                    "127.0.0.1", 0, "signed").start()
    auth = Signer(secret)
    off, on = [], []
    try:
        for _ in range(args.rounds):
            off.append(cpu_per_request(f"http://127.0.0.1:{plain.port}/v1/x", payload,
                                       args.requests, None))
            on.append(cpu_per_request(f"http://127.0.0.1:{signed.port}/v1/x", payload,
                                      args.requests, auth))
    finally:
        plain.close()
        signed.close()
    best_off, best_on = min(off), min(on)
    print(f"{args.requests} requests x {args.rounds} rounds, {args.body}-byte bodies: CPU per "
          f"request no secret {best_off * 1e6:.0f} us, signed {best_on * 1e6:.0f} us (+"
          f"{(best_on - best_off) * 1e6:.0f} us) -> requests/CPU-s x{best_off / best_on:.3f}")


if __name__ == "__main__":
    main()
