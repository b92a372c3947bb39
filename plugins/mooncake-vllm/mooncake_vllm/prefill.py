"""VllmPrefill: `POST /v1/prefill` (the native prefill worker's message) on vLLM.

With a decode worker named, it is the first half of vLLM's disaggregation protocol: the decode
worker is first handed the `kv_transfer_params` its vLLM will pull the prompt's KV with
(`do_remote_prefill`, this engine's id and bootstrap address, a fresh transfer id: decode.py's
/v1/kv/handoff), then this vLLM computes the prompt with `max_tokens` 1 and `do_remote_decode`,
which keeps its blocks until the decode worker's MooncakeConnector has read them. The answer
is the native one: the first token, the prompt's length, the tokens vLLM found cached (its own
prefix cache and the store), and the keys of the blocks it computed (it holds them now).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from mooncake_cli.api import roles
from mooncake_cli.api.errors import ErrorCode, ServingError, bad, peer_code
from mooncake_cli.api.schema import parse
from mooncake_cli.http.server import body, note
from mooncake_cli.kvkeys import block_keys
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mooncake_vllm.sampling import vllm_params
from mooncake_vllm.worker import VllmWorker

HANDOFF_S = 30.0  # seconds the decode worker has to take a handoff


class VllmPrefill(VllmWorker):
    role = "prefill"

    def routes(self) -> list[Route]:
        async def prefill(request: Request) -> Response:
            self.refuse_when_draining()
            req = parse(roles.PrefillRequest, await body(request))
            note(request, request_id=req.request_id, decode=req.decode)
            self.active += 1
            try:
                answer = await self.prefill(req)
            finally:
                self.active -= 1
            note(request, prompt_tokens=answer.prompt_tokens, cached_tokens=answer.cached_tokens)
            return JSONResponse(answer.model_dump(mode="json"))

        return [*super().routes(), Route("/v1/prefill", prefill, methods=["POST"])]

    async def prefill(self, req: roles.PrefillRequest) -> roles.PrefillAnswer:
        from vllm.inputs import TokensPrompt

        t0 = time.perf_counter()
        tokens = list(req.token_ids) if req.token_ids is not None else \
            self.tokenizer.encode(req.prompt or "")
        if not tokens or len(tokens) >= self.engine.max_model_len:
            raise bad(f"a prompt of {len(tokens)} tokens: this worker's vLLM takes 1 to "
                      f"{self.engine.max_model_len - 1}", "token_ids")
        transfer = f"{req.request_id}-{uuid.uuid4().hex[:12]}"  # one per attempt
        kv: dict[str, Any] = {"do_remote_decode": bool(req.decode), "do_remote_prefill": False,
                              "transfer_id": transfer}
        if req.decode:
            await self._hand_off(req, len(tokens), transfer)
        handed = time.perf_counter()
        last = None
        try:
            async for out in self.engine.llm.generate(
                    TokensPrompt(prompt_token_ids=tokens),
                    vllm_params(req.sampling, 1, kv, prefill=True), request_id=transfer):
                last = out
        except Exception as e:  # the engine died, or refused the request
            if req.decode:
                await self._release(req.decode, req.request_id)
            self.metrics.add("requests_failed")
            raise ServingError(ErrorCode.PREFILL_FAILED, f"prefill {req.request_id} on vLLM "
                               f"failed: {type(e).__name__}: {e}") from None
        if last is None or not last.outputs[0].token_ids:
            raise ServingError(ErrorCode.PREFILL_FAILED,
                               f"prefill {req.request_id}: vLLM answered no token")
        cached = int(last.num_cached_tokens or 0)
        bs = self.cfg.block_size
        end = time.perf_counter()
        return roles.PrefillAnswer(
            request_id=req.request_id, first_token=int(last.outputs[0].token_ids[0]),
            prompt_tokens=len(tokens), cached_tokens=cached,
            stored_keys=block_keys(tokens, self.ns)[cached // bs:len(tokens) // bs],
            timing=roles.PrefillTiming(transfer=round(handed - t0, 6),
                                       compute=round(end - handed, 6), total=round(end - t0, 6)),
            token_ids=tokens if req.token_ids is None else None,
            pipeline=None if req.pipeline is None else roles.PipelineReport(
                chunk_tokens=req.pipeline.chunk_tokens,
                fallback="vLLM workers run no pipeline stages (kvcache-pipeline is our "
                         "engine's): the prefill ran on this worker alone"))

    async def _hand_off(self, req: roles.PrefillRequest, num_tokens: int, transfer: str) -> None:
        """What the decode worker's vLLM pulls the KV with; ServingError as a native
        prefill's reservation fails (DECODE_UNREACHABLE, DECODE_FULL, ...)."""
        assert req.decode is not None
        url = req.decode.rstrip("/")
        params = {"do_remote_prefill": True, "do_remote_decode": False,
                  "transfer_id": transfer, "remote_engine_id": self.name,
                  "remote_bootstrap_addr": f"http://{self.reach}:{self.bootstrap}"}
        msg = {"request_id": req.request_id, "num_tokens": num_tokens,
               "max_tokens": req.sampling.max_tokens, "kv_transfer_params": params}
        try:
            ans = await self.peer.call(url + "/v1/kv/handoff", msg, timeout_s=HANDOFF_S)
        except (OSError, ValueError) as e:
            raise ServingError(ErrorCode.DECODE_UNREACHABLE,
                               f"decode worker {url} unreachable: {e}") from None
        if ans.status == 200:
            return
        message, code = peer_code(ans.body)
        message = f"decode worker {url} refused the KV handoff: {message}"
        if code is ErrorCode.DECODE_TOO_LARGE:
            raise ServingError(code, message)
        if code is ErrorCode.UNAVAILABLE:  # shutting down: as good as gone
            raise ServingError(ErrorCode.DECODE_UNREACHABLE, message)
        if ans.status == 404 and code is ErrorCode.NOT_FOUND:
            message += " (a decode worker on vLLM takes it: is that one --engine vllm?)"
        raise ServingError(ErrorCode.DECODE_REFUSED, message)

    async def _release(self, decode: str, request_id: str) -> None:
        try:
            await self.peer.call(decode.rstrip("/") + "/v1/kv/release",
                                 {"request_id": request_id}, timeout_s=HANDOFF_S)
        except (OSError, ValueError):
            pass  # the handoff expires there
