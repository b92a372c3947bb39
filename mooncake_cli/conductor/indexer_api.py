"""The KV indexer API on the conductor (upstream Mooncake's conductor indexer, also Dynamo's
standalone indexer; `mooncake_cli.api.indexer` has the shapes, docs/indexer.md the semantics).

    POST /register, /unregister     an event stream; need the cluster secret, as every
                                    state-changing route of the conductor
    POST /query, /query_by_hash     the longest prefix per instance and tier; read-only, so
                                    guarded as /v1/instances is (the --api-key, when set)
    GET  /indexer/streams           each stream's events and blocks (the cluster secret)

Bodies are bounded by the conductor's edge (`Limits.max_body`) and the models' list lengths.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mooncake_cli.api import indexer as ia
from mooncake_cli.api.errors import bad
from mooncake_cli.api.schema import parse
from mooncake_cli.conductor.indexer import Indexer, Scope
from mooncake_cli.conductor.seqhash import seq_hashes
from mooncake_cli.http.server import body, note

READ = ("/query", "/query_by_hash")
AUDITED = {"/register": "indexer-register", "/unregister": "indexer-unregister"}


def _scope(q: ia.Query | ia.QueryByHash) -> Scope:
    return Scope(q.model, q.block_size, q.lora_name, q.tenant_id, q.instance_id,
                 q.cache_salt or "")


def _answer(tenant: str, matches: dict[str, ia.InstanceMatch]) -> Response:
    return JSONResponse(ia.QueryAnswer({tenant: matches}).model_dump())


def indexer_routes(ix: Indexer) -> list[Route]:
    async def register(request: Request) -> Response:
        reg = parse(ia.Register, await body(request))
        note(request, name=reg.instance_id, endpoint=reg.endpoint)
        ix.register(reg)
        return JSONResponse(ia.Registered(instance_id=reg.instance_id).model_dump())

    async def unregister(request: Request) -> Response:
        req = parse(ia.Unregister, await body(request))
        note(request, name=req.instance_id)
        removed = ix.unregister(req)
        return JSONResponse(ia.Unregistered(removed_instances=removed).model_dump())

    async def query(request: Request) -> Response:
        q = parse(ia.Query, await body(request))
        try:
            hashes = seq_hashes(q.token_ids, q.block_size)
        except ValueError as e:  # out-of-range ids are refused by the model already
            raise bad(str(e), "token_ids") from None
        return _answer(q.tenant_id, ix.match(_scope(q), hashes, q.token_ids))

    async def query_by_hash(request: Request) -> Response:
        q = parse(ia.QueryByHash, await body(request))
        return _answer(q.tenant_id, ix.match(_scope(q), q.seq_hashes))

    async def streams(request: Request) -> Response:
        return JSONResponse({"streams": ix.snapshot()})

    post = ["POST"]
    return [Route("/register", register, methods=post),
            Route("/unregister", unregister, methods=post),
            Route("/query", query, methods=post),
            Route("/query_by_hash", query_by_hash, methods=post),
            Route("/indexer/streams", streams)]
