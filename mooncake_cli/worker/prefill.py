"""PrefillWorker: one request at a time in arrival order — reuse stored prefix blocks, compute
the rest in chunks (alone, or as the lead of a pipeline of other prefill workers when the
request asks for one), stream the KV to the decode worker while computing, store new blocks.
Between its own requests it serves other leads' pipeline stages (worker/pipelined.py)."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from starlette.routing import Route

from mooncake_cli.api import roles
from mooncake_cli.api.errors import ErrorCode, ServingError, bad
from mooncake_cli.engine import ModelError, Sequence
from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.kvkeys import block_keys
from mooncake_cli.transfer.linkstats import reads_since
from mooncake_cli.worker.http import prefill_routes
from mooncake_cli.worker.kvstream import KVStream
from mooncake_cli.worker.pipelined import Pipelines
from mooncake_cli.worker.prefetch import Prefetcher
from mooncake_cli.worker.prefix import PrefixStore
from mooncake_cli.worker.runtime import WorkerRuntime

log = logging.getLogger("mooncake.worker")


@dataclass
class PrefillJob:
    request_id: str
    seq: Sequence
    decode_url: str | None
    reuse: str = "any"
    pipeline: roles.Pipeline | None = None
    arrived: float = field(default_factory=time.perf_counter)
    answer: Future[roles.PrefillAnswer] = field(default_factory=Future)


class PrefillWorker(WorkerRuntime):
    role = "prefill"

    def routes(self) -> list[Route]:
        return [*prefill_routes(self), *self.pipelines.routes()]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.pipelines = Pipelines()  # its routes are made before the transfer engine
        super().__init__(*args, **kwargs)
        assert self.engine is not None
        self.pipelines.attach(self.model, self.cache, self.engine, self.pool_region,
                              self.auth, self.url)
        self.wire.register(self.engine)  # int8: the staging area streams are sent from
        self.prefix = PrefixStore(self.store, self.cache, self.wire) \
            if self.store is not None else None
        self.prefetch = Prefetcher(self.prefix, self.metrics) if self.prefix else None
        self._evictions_seen = 0
        self._queue: queue.Queue[PrefillJob | None] = queue.Queue()
        self._lock = threading.Lock()
        self._queued_tokens = 0
        self._busy = 0
        self._thread = threading.Thread(target=self._serve, name="mooncake-prefill", daemon=True)
        self._thread.start()

    def load(self) -> dict[str, Any]:
        with self._lock:
            queued, busy, tokens = self._queue.qsize(), self._busy, self._queued_tokens
        busy = max(busy, self.pipelines.busy())  # another lead's stage
        return {"role": self.role, "running": busy, "waiting": queued,
                "free_blocks": self.cache.allocator.free, "total_blocks": self.cache.num_blocks,
                "recent_step_s": self.metrics.recent_step_s(),
                "queued_prefill_tokens": tokens}

    # -- the HTTP entry: validate, queue, wait (without holding a thread) -------------------
    async def prefill(self, req: roles.PrefillRequest) -> roles.PrefillAnswer:
        tokens = list(req.token_ids) if req.token_ids is not None else \
            self.model.tokenizer.encode(req.prompt or "")
        try:
            seq = self.runner.new_sequence(tokens, req.sampling)
        except ModelError as e:
            raise bad(str(e), "token_ids") from None
        if self.cache.blocks_for(len(tokens)) > self.cache.num_blocks:
            raise bad(f"prompt of {len(tokens)} tokens needs "
                      f"{self.cache.blocks_for(len(tokens))} KV blocks; this worker "
                      f"has {self.cache.num_blocks} (raise --kv-blocks)", "token_ids")
        job = PrefillJob(req.request_id, seq, req.decode, req.reuse, req.pipeline)
        with self._lock:
            if self._queue.qsize() >= self.cfg.max_waiting:
                raise ServingError(ErrorCode.UNAVAILABLE, f"prefill queue is full "
                                   f"({self.cfg.max_waiting} requests)", retry_after=1)
            behind = self._busy or self._queue.qsize()
            self._queued_tokens += len(tokens)
            self._queue.put(job)
        if behind and req.prefetch and req.reuse == "any" and self.prefetch is not None:
            self.prefetch.start(req.request_id, block_keys(tokens, self.wire.ns), "busy")
        try:
            answer = await asyncio.wrap_future(job.answer)
        except ServingError:
            self.metrics.add("requests_failed")
            raise
        except asyncio.CancelledError:  # its caller left: so does its prefetch
            if self.prefetch is not None:
                self.prefetch.cancel(req.request_id)
            raise
        if req.token_ids is None:
            answer = answer.model_copy(update={"token_ids": tokens})
        return answer

    def _serve(self) -> None:
        while (job := self._queue.get()) is not None:
            with self._lock:
                self._queued_tokens -= len(job.seq.prompt_ids)
                self._busy = 1
            try:
                if not job.answer.set_running_or_notify_cancel():
                    self.runner.release(job.seq)  # its caller left before its turn
                    continue
                with self.pipelines.local_work():  # after a stage running here ends
                    job.answer.set_result(self._run(job))
            except ServingError as e:
                job.answer.set_exception(e)
            except MooncakeError as e:
                job.answer.set_exception(ServingError(
                    ErrorCode.PREFILL_FAILED, f"prefill {job.request_id} failed: {e}"))
            except Exception as e:  # the loop must survive any one request
                log.exception("prefill %s failed", job.request_id)
                job.answer.set_exception(ServingError(
                    ErrorCode.INTERNAL, f"prefill {job.request_id} failed: {e}"))
            finally:
                with self._lock:
                    self._busy = 0

    # -- one request -------------------------------------------------------------------------
    def _run(self, job: PrefillJob) -> roles.PrefillAnswer:
        t0 = time.perf_counter()
        seq, bs = job.seq, self.cache.block_size
        tokens = seq.prompt_ids
        timing = {"queue": t0 - job.arrived, "load": 0.0, "compute": 0.0, "store": 0.0,
                  "transfer": 0.0, "replicate": 0.0}
        stream: KVStream | None = None
        try:
            if job.decode_url:
                t = time.perf_counter()
                assert self.engine is not None, "the worker is closed"
                stream = KVStream(self.engine, self.pool_region, job.decode_url,
                                  job.request_id, len(tokens), self.ns.block_bytes,
                                  seq.params.max_tokens,
                                  num_blocks=self.cache.blocks_for(len(tokens)),
                                  auth=self.auth, wire=self.wire)
                timing["transfer"] += time.perf_counter() - t
            keys = block_keys(tokens, self.wire.ns)
            links = self.engine.links if self.engine is not None else None
            t = time.perf_counter()
            pulled = self.prefetch.claim(job.request_id) if self.prefetch else None
            with self.prefetch.loading() if self.prefetch else nullcontext():
                before = links.snapshot() if links else {}
                loaded = self.prefix.load(keys, len(tokens), seq.block_table, job.reuse) \
                    if self.prefix and job.reuse != "none" else 0
                fetched = [roles.FetchedFrom(segment=peer, bytes=m.bytes,
                                             seconds=round(m.seconds, 6))
                           for peer, m in reads_since(before, links.snapshot()).items()] \
                    if links else []  # what the engine read from other segments: link speed
            seq.num_computed = loaded * bs
            timing["load"] = time.perf_counter() - t
            first, sent, piped = self._prefill(job, stream, timing)
            t = time.perf_counter()
            full = len(tokens) // bs
            stored = self.prefix.put(keys[loaded:full], seq.block_table[loaded:full]) \
                if self.prefix else []
            timing["store"] = time.perf_counter() - t
            if stream is not None:
                t = time.perf_counter()
                stream.send((i, seq.block_table[i]) for i in range(sent, len(seq.block_table)))
                stream.finish()
                timing["transfer"] += time.perf_counter() - t
                self.metrics.add("kv_bytes_sent", stream.bytes_sent)
            t = time.perf_counter()  # after the first token: fetched blocks get a replica here
            replicated = self.prefix.replicate(keys[:loaded], seq.block_table[:loaded]) \
                if self.prefix and job.reuse == "any" else []
            timing["replicate"] = time.perf_counter() - t
        except BaseException:
            if stream is not None:
                stream.release()
            raise
        finally:
            self.wire.forget()  # the blocks it loaded may hold other KV from now on
            self.runner.release(seq)
        self._count(len(tokens), loaded * bs, len(stored))
        timing["total"] = time.perf_counter() - job.arrived
        return roles.PrefillAnswer(
            request_id=job.request_id, first_token=first, prompt_tokens=len(tokens),
            cached_tokens=loaded * bs, stored_keys=stored, replicated_keys=replicated,
            finish_reason=seq.finish_reason,
            timing=roles.PrefillTiming(**{k: round(v, 6) for k, v in timing.items()}),
            pipeline=piped, fetched=fetched, prefetched=pulled.pulled if pulled else 0)

    def _prefill(self, job: PrefillJob, stream: KVStream | None, timing: dict[str, float]
                 ) -> tuple[int, int, roles.PipelineReport | None]:
        """Compute the pending tokens, through the job's pipeline if it has one (alone when
        that cannot finish); (first token, blocks sent, the pipeline's report)."""
        if job.pipeline is None:
            return (*self._compute(job.seq, stream, timing), None)
        seq, bs = job.seq, self.cache.block_size
        sent = 0

        def whole(n: int) -> None:  # the first n blocks are whole here: stream the full ones
            nonlocal sent
            sent = self._stream(stream, seq, sent, min(n, seq.num_prompt // bs), timing)

        t = time.perf_counter()
        first, report = self.pipelines.lead(seq, job.pipeline, job.request_id,
                                            lambda s, logits: self.runner.sample([s], logits)[0],
                                            whole, self.metrics)
        if first is not None:
            timing["compute"] += time.perf_counter() - t
            return first, sent, report
        log.warning("pipelined prefill %s runs alone: %s", job.request_id, report.fallback)
        return (*self._compute(seq, stream, timing, sent), report)

    def _compute(self, seq: Sequence, stream: KVStream | None,
                 timing: dict[str, float], sent: int = 0) -> tuple[int, int]:
        """Chunked prefill of the pending tokens; after each chunk the newly completed blocks
        go to the decode worker (after the first `sent`). (first token, blocks sent)."""
        bs = self.cache.block_size
        while True:
            sent = self._stream(stream, seq, sent, seq.num_computed // bs, timing)
            t = time.perf_counter()
            logits = self.runner.step([seq])
            step = time.perf_counter() - t
            self.metrics.step(step)
            timing["compute"] += step
            if seq.num_pending == 0:
                t = time.perf_counter()
                first = self.runner.sample([seq], logits)[0]
                timing["compute"] += time.perf_counter() - t
                return first, sent

    @staticmethod
    def _stream(stream: KVStream | None, seq: Sequence, sent: int, full: int,
                timing: dict[str, float]) -> int:
        """Send the decode worker blocks [sent, full) of `seq`; the blocks sent now."""
        if stream is None or full <= sent:
            return sent
        t = time.perf_counter()
        stream.send((i, seq.block_table[i]) for i in range(sent, full))
        timing["transfer"] += time.perf_counter() - t
        return full

    def _count(self, prompt: int, hit: int, stored_blocks: int) -> None:
        m = self.metrics
        m.add("requests")
        m.add("prompt_tokens", prompt)
        m.add("prefix_hit_tokens", hit)
        m.add("computed_tokens", prompt - hit)
        m.add("kv_bytes_loaded", hit // self.cache.block_size * self.wire.object_bytes)
        m.add("kv_bytes_stored", stored_blocks * self.wire.object_bytes)
        m.add("generated_tokens", 1)
        if self.prefix is not None and self.prefix.evictions > self._evictions_seen:
            m.add("prefix_evictions", self.prefix.evictions - self._evictions_seen)
            self._evictions_seen = self.prefix.evictions

    # -- shutdown ----------------------------------------------------------------------------
    def drain(self, timeout: float) -> None:
        if self.prefetch is not None:
            self.prefetch.close()
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("prefill still running after %.0f s of draining", timeout)
        while True:  # jobs behind the sentinel (or left by a timeout) fail clearly
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None and job.answer.set_running_or_notify_cancel():
                job.answer.set_exception(ServingError(
                    ErrorCode.UNAVAILABLE, f"prefill worker {self.name} is shutting down"))
