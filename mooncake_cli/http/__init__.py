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

Why h1pool for every caller: `scripts/http_client_bench.py` sends small JSON POSTs to an edge
server in another process over loopback, one after another and 32 at once, through each
candidate. On the 2-core test VM (2000 requests, best of 3 rounds), h1pool's async peer did
6700 requests/s one after another (55 us of client CPU each) and 11100 at once (46 us), against
3400 and 7000 for aiohttp (133 and 82 us) and 1000 and 560 for httpcore's async pool; its sync
calls, from the caller's thread through the background loop, did 3500 and 6100 requests/s
(127 and 156 us), against 2400 and 970 for httpcore's sync pool (267 and 1011 us) and 1900 and
1150 for httpx.Client. So the sync calls, which used httpcore (and httpx for the metadata and
`mooncake top` requests), go through h1pool too: one pool, one set of timeouts and bounds.
"""
