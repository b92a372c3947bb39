"""The HTTP stack of every role: the edge that serves, the one client between the roles, the
cluster secret and the audit log.

- `server`: a Starlette app under uvicorn with the edge's bounds and error bodies (`edge_app`,
  `Server`, `body`, `sse`); `bounds`: the connection bounds under it (header deadline and size,
  waiting connections); `middleware`: the guard and the audit line of each request.
- `auth`: the cluster secret (signed requests, signed records) and the OpenAI API key;
  `audit`: the audit log; `metrics`: Prometheus registries and their text.
- `jsonhttp`: the client every role and the CLI call each other through, sync (`call`,
  `events`, `fetch`) and async (`AsyncPeer`), on `h1pool` (keep-alive connections per host, on
  httptools' parser); `background`: the loop the sync calls run on.

Why h1pool for every caller: `scripts/http_client_bench.py --requests 2000 --concurrency 32
--rounds 3` sends small JSON POSTs to an edge server in another process over loopback, one after
another and 32 at once, through each candidate (best round of each). On the shared 2-core test
VM, requests/s one after another / 32 at once, and client CPU per request:
- async: h1pool's AsyncPeer 6650 / 6200 (58 / 60 us); aiohttp 3350 / 4300 (157 / 130 us);
  httpcore's async pool 1400 / 270; httpx.AsyncClient 860 / 370.
- sync: `call` through the background loop 3300 / 6200 (161 / 107 us); httpcore's sync pool
  (what `call` used) 2000 / 1200 (232 / 698 us); httpx.Client (the metadata client and
  `mooncake top`) 1900 / 1100 (405 / 939 us).
An earlier run on the same VM gave the same order. So every caller goes through h1pool: one
pool per loop, one set of timeouts and bounds (tests/integration/test_h1pool.py,
tests/integration/test_jsonhttp.py).
"""
