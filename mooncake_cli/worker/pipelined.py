"""A prefill worker's part in pipelined prefills (worker/pipeline.py): the stage host serving
the stages other leads ask of it, and `lead`, which runs one of the worker's own requests as
the lead of a pipeline when the conductor asks for one (`PrefillRequest.pipeline`).

A pipeline that cannot finish (a stage busy, gone or failing; its hand-off refused) is not
an error of the request: `lead` answers no token and says why, the worker's sequence is back
at its reused prefix, and the worker computes the request alone (what it has streamed to the
decode worker already was whole blocks, and stays valid).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from starlette.routing import Route

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.api.roles import Pipeline, PipelineReport
from mooncake_cli.engine import KVCache, Model, Sequence
from mooncake_cli.engine.stages import split_layers
from mooncake_cli.http.auth import Signer
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region
from mooncake_cli.worker.metrics import WorkerMetrics
from mooncake_cli.worker.pipeline_lead import LeadTiming, lead_prefill
from mooncake_cli.worker.stage_host import StageHost, stage_routes

# failures after which the lead computes the request alone; others fail the request
FALLBACK = (ErrorCode.PREFILL_FAILED, ErrorCode.UNAVAILABLE, ErrorCode.KV_FULL,
            ErrorCode.NOT_FOUND, ErrorCode.INVALID_REQUEST)
STAGE_TIMEOUT = 120.0  # seconds a stage (or the lead) waits for the next chunk's notice


class Pipelines:
    """Made with the worker's transfer engine; until then `routes()` answer 503."""

    def __init__(self) -> None:
        self.host: StageHost | None = None
        self.url = ""

    def attach(self, model: Model, cache: KVCache, engine: TransferEngine,
               pool_region: Region, auth: Signer | None, url: str) -> None:
        """Serve stages of `model` over `cache` (its pool registered as `pool_region`);
        prompts of up to what the cache holds (the inbox keeps a hidden state per token)."""
        rows = min(model.config.max_position, cache.num_blocks * cache.block_size)
        self.host = StageHost(model, cache, engine, auth, rows, pool_region, STAGE_TIMEOUT)
        self.url = url

    def _host(self) -> StageHost:
        if self.host is None:
            raise ServingError(ErrorCode.UNAVAILABLE, "this worker is still starting",
                               retry_after=1)
        return self.host

    def routes(self) -> list[Route]:
        return stage_routes(self._host)

    def local_work(self) -> AbstractContextManager[None]:
        """Hold this worker for a prefill of its own (see StageHost.local_work)."""
        return self._host().local_work()

    def busy(self) -> int:
        """1 while this worker runs another lead's stage."""
        return int(self.host is not None and self.host.job is not None)

    def lead(self, seq: Sequence, spec: Pipeline, request_id: str,
             sample: Callable[[Sequence, torch.Tensor], int],
             on_blocks: Callable[[int], None],
             metrics: WorkerMetrics) -> tuple[int | None, PipelineReport]:
        """Prefill `seq` as the lead of `spec`; (the first token, or None when the worker
        must compute the request alone, with the report saying why)."""
        host = self._host()
        layers = host.model.config.num_layers
        stages = len(spec.stages) + 1
        if stages > layers:
            raise ServingError(ErrorCode.INVALID_REQUEST, f"{stages} pipeline stages for a "
                               f"model of {layers} layers", "pipeline")
        ranges = split_layers(layers, stages)
        timing = LeadTiming()
        start = seq.num_computed
        try:
            first = lead_prefill(host, seq, spec.stages, ranges, spec.chunk_tokens, self.url,
                                 request_id, on_blocks=on_blocks, timing=timing,
                                 sample=sample)
        except ServingError as e:
            if e.code not in FALLBACK:
                raise
            seq.num_computed = start
            metrics.add("pipeline_fallbacks")
            return None, PipelineReport(chunk_tokens=spec.chunk_tokens,
                                        fallback=e.message or e.code.value,
                                        bytes_sent=timing.bytes_sent)
        metrics.add("pipelined_prefills")
        metrics.add("stage_bytes_sent", timing.bytes_sent)
        return first, PipelineReport(
            stages=[self.url, *spec.stages], layers=[[r.start, r.stop] for r in ranges],
            chunk_tokens=spec.chunk_tokens, begin=round(timing.begin, 6),
            compute=round(timing.compute, 6),
            handoff=round(timing.handoff, 6), drain=round(timing.drain, 6),
            bytes_sent=timing.bytes_sent)

