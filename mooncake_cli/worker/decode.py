"""DecodeWorker: KV reservations filled by prefill workers, and continuous batching — one loop
thread runs decode steps over every running request; requests join and leave between steps.

KV memory is allocated as sequences grow: a reservation holds the prompt's blocks, and a running
sequence gets its next block when its last one is full. When none is free, the most recently
admitted sequences are preempted (vLLM's order): their KV is parked in the store, their blocks
freed, and they resume first, ahead of new reservations, once there is room again.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import torch
from starlette.routing import Route

from mooncake_cli.api import roles
from mooncake_cli.api.errors import ErrorCode, ServingError, bad
from mooncake_cli.engine import ModelError, Sequence
from mooncake_cli.worker.decode_request import DecodeRequest, Reservation
from mooncake_cli.worker.http import decode_routes
from mooncake_cli.worker.kvgrant import RESERVATION_TTL
from mooncake_cli.worker.kvmemory import KVMemory
from mooncake_cli.worker.parking import Parking
from mooncake_cli.worker.prefix import PrefixStore
from mooncake_cli.worker.runtime import WorkerRuntime
from mooncake_cli.worker.writebehind import WriteBehind

log = logging.getLogger("mooncake.worker")


class DecodeWorker(WorkerRuntime):
    role = "decode"

    def routes(self) -> list[Route]:
        return decode_routes(self)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        prefix = PrefixStore(self.store, self.cache, self.wire) if self.store else None
        self.behind = WriteBehind(prefix, self.cache, self.wire.ns, self.metrics) \
            if prefix is not None and self.cfg.write_behind else None
        self._cv = threading.Condition()
        self._order = itertools.count()
        self._active: set[str] = set()  # reserved, running or preempted request ids
        self._reserved: dict[str, Reservation] = {}
        self._inbox: deque[DecodeRequest] = deque()
        self._running: list[DecodeRequest] = []  # in admission order
        self._preempted: deque[DecodeRequest] = deque()
        self._stop = threading.Event()
        self.memory = KVMemory(self.cache, Parking(prefix, self.runner, self.wire.ns), self.metrics,
                               self._cv, self._running, self._preempted, self._end,
                               self._stop.is_set)
        self._thread = threading.Thread(target=self._loop, name="mooncake-decode", daemon=True)
        self._thread.start()

    def load(self) -> dict[str, Any]:
        with self._cv:
            running, waiting = len(self._running), len(self._inbox)
            preempted = len(self._preempted)
        m = self.metrics
        return {"role": self.role, "running": running, "waiting": waiting,
                "preempted": preempted, "free_blocks": self.cache.allocator.free,
                "total_blocks": self.cache.num_blocks,
                "recent_step_s": m.recent_step_s(), "queued_prefill_tokens": 0,
                "preemptions": int(m.get("preemptions")),
                "parked_blocks": int(m.get("parked_blocks")),
                "reloaded_blocks": int(m.get("reloaded_blocks")),
                "recomputed_tokens": int(m.get("recomputed_tokens"))}

    def _check_fits(self, num_tokens: int, max_tokens: int) -> None:
        """DECODE_TOO_LARGE (413) unless the request could finish alone in this cache."""
        final = self.cache.blocks_for(min(num_tokens + max_tokens,
                                          self.model.config.max_position))
        if max(final, self.cache.blocks_for(num_tokens)) > self.cache.num_blocks:
            self.metrics.add("requests_failed")
            raise ServingError(ErrorCode.DECODE_TOO_LARGE, f"a request of {num_tokens} + "
                               f"{max_tokens} tokens needs {final} KV blocks; this decode "
                               f"worker has {self.cache.num_blocks}")

    # -- reservations ------------------------------------------------------------------------
    def reserve(self, req: roles.ReserveRequest) -> roles.ReserveAnswer:
        """Blocks for the prompt's KV, if they are free now beyond the growth reserve (the
        watermark and a block for each running sequence) and no preempted sequence waits for
        them; KV_FULL (503, retry) otherwise."""
        rid, num_tokens = req.request_id, req.num_tokens
        self._check_fits(num_tokens, req.max_tokens)
        need = self.cache.blocks_for(num_tokens)
        with self._cv:
            if rid in self._active:
                raise ServingError(ErrorCode.CONFLICT,
                                   f"request {rid!r} already holds KV blocks here")
            free = self.cache.allocator.free
            keep = self.memory.watermark + len(self._running)  # the next block of each running one
            if self._preempted or free - need < keep:
                self.metrics.add("requests_failed")
                why = f"{len(self._preempted)} preempted requests resume first" \
                    if self._preempted else f"{need} blocks wanted, {free} of " \
                    f"{self.cache.num_blocks} free ({keep} kept for growth)"
                raise ServingError(ErrorCode.KV_FULL, f"KV cache full: {why}", retry_after=1)
            blocks = self.cache.allocator.allocate(need)
            self._reserved[rid] = Reservation(rid, blocks, num_tokens)
            self._active.add(rid)
        assert self.engine is not None
        return roles.ReserveAnswer(segment=self.engine.name, engine=self.engine.address,
                                   block_ids=blocks, block_bytes=self.ns.block_bytes,
                                   base=self.pool_region.base, kv_wire=self.wire.name)

    def release(self, req: roles.ReleaseRequest) -> roles.ReleaseAnswer:
        rid = req.request_id
        with self._cv:
            res = self._reserved.pop(rid, None)
            if res is None:
                raise ServingError(ErrorCode.NOT_FOUND, f"no KV reservation for request {rid!r}")
            n = len(res.blocks)
            self._free(rid, res.blocks)
        return roles.ReleaseAnswer(request_id=rid, released_blocks=n)

    def forget(self, rid: str | None) -> None:
        """Free the reservation of `rid` (if any): its /v1/generate was refused."""
        with self._cv:
            res = self._reserved.pop(rid, None) if rid is not None else None
            if res is not None:
                self._free(rid or "", res.blocks)

    def _free(self, rid: str, blocks: list[int]) -> None:
        self.cache.allocator.release(list(blocks))
        blocks.clear()
        self._active.discard(rid)

    # -- generation --------------------------------------------------------------------------
    def generate(self, body: roles.GenerateRequest) -> AsyncIterator[dict[str, Any] | str]:
        """Join the batch (call from the event loop that streams the answer)."""
        rid = body.request_id
        with self._cv:
            res = self._reserved.pop(rid, None)
        if res is None:
            raise ServingError(ErrorCode.NOT_FOUND, f"no KV reservation for request {rid!r}: "
                               "reserve blocks with /v1/kv/reserve and fill them before "
                               "/v1/generate")
        try:  # whatever fails before the request joins the batch gives its blocks back
            tokens, first, params = list(body.token_ids), body.first_token, body.sampling
            if first >= self.model.config.vocab_size:
                raise bad(f"'first_token' must be below the vocabulary size "
                          f"{self.model.config.vocab_size}", "first_token")
            if len(tokens) != res.num_tokens:
                raise bad(f"{len(tokens)} prompt tokens, but the reservation holds "
                          f"the KV of {res.num_tokens}", "token_ids")
            prompt = body.resume.prompt_tokens if body.resume else len(tokens)
            try:
                seq = self.runner.new_sequence(tokens, params)
            except ModelError as e:
                raise bad(str(e), "token_ids") from None
            seq.prompt_ids = tokens[:prompt]
            self._check_fits(len(tokens), max(0, params.max_tokens - (len(tokens) - prompt)))
            self.metrics.add("kv_bytes_loaded", len(res.blocks) * self.wire.object_bytes)
            self.wire.landed(res.blocks)  # int8: the prefill wrote objects, not blocks
            seq.block_table = res.blocks
            seq.num_computed = len(tokens)
            req = DecodeRequest(rid, seq, next(self._order))
            if body.resume is not None:  # count what the client has had as sent already
                sent = self.model.tokenizer.decode(seq.output_ids) if seq.output_ids else ""
                req.sent_text = sent[:body.resume.sent_chars]
            self._append(seq, first)
            req.token(first, self.model.tokenizer.decode)
            if self.behind is not None:
                self.behind.follow(req)
        except Exception as e:
            with self._cv:
                self._free(rid, res.blocks)
            self.metrics.add("requests_failed")
            if isinstance(e, ServingError):
                raise
            log.exception("generate %s failed", rid)
            raise ServingError(ErrorCode.INTERNAL, f"generate {rid} failed: {e}") from None
        with self._cv:
            if seq.finished:
                self._end(req)
            else:
                self._inbox.append(req)
                self._cv.notify()
        return req.stream(self._wake)

    def _append(self, seq: Sequence, token: int) -> None:
        """Append the prefill's first token through the sampler, so stop conditions apply and a
        seeded generator advances exactly as it would have in one process."""
        logits = torch.full((1, self.model.config.vocab_size), float("-inf"))
        logits[0, token] = 0.0
        self.runner.sample([seq], logits)

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def _end(self, req: DecodeRequest, error: str | None = None) -> None:
        """Finish `req` (caller holds the lock): free its blocks, send its final event."""
        self._free(req.request_id, req.seq.block_table)
        if self.behind is not None:
            self.behind.forget(req)
        req.finish(error)
        for queue in (self._running, self._preempted):
            if req in queue:
                queue.remove(req)
        self.metrics.add("requests_failed" if error or req.cancelled else "requests")

    # -- the batch loop ----------------------------------------------------------------------
    def _expire(self) -> None:
        now = time.monotonic()
        for rid, res in list(self._reserved.items()):
            if now - res.created > RESERVATION_TTL:
                log.warning("reservation %s unused for %.0f s: freeing its blocks", rid,
                            RESERVATION_TTL)
                del self._reserved[rid]
                self._free(rid, res.blocks)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._cv:
                while self._inbox:
                    self._running.append(self._inbox.popleft())
                self._expire()
                for r in [r for r in self._running if r.cancelled]:
                    self._end(r)
                if not self._running and not self._preempted:
                    self._cv.wait(0.2)
                    continue
            try:
                self.memory.resume()
                self.memory.make_room()
                batch = list(self._running)
                if not batch:
                    time.sleep(0.01)  # nothing fits yet: reservations hold the blocks
                    continue
                t = time.perf_counter()
                tokens = self.runner.decode([r.seq for r in batch])
                self.metrics.step(time.perf_counter() - t)
            except Exception as e:  # a failed step fails its batch, not the worker
                log.exception("decode step failed")
                with self._cv:
                    for r in list(self._running):
                        self._end(r, f"decode step failed: {e}")
                continue
            self.metrics.add("generated_tokens", len(batch))
            if self.behind is not None:  # before a finished sequence's blocks are freed
                self.behind.after_step(batch)
            with self._cv:
                for r, token in zip(batch, tokens, strict=True):
                    r.token(token, self.model.tokenizer.decode)
                    if r.seq.finished:
                        self._end(r)

    def drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._cv:
                if not self._running and not self._inbox and not self._preempted:
                    break
            time.sleep(0.05)
        self._stop.set()
        self._thread.join(timeout=30)
        with self._cv:
            for r in [*self._running, *self._inbox, *self._preempted]:
                self._end(r, f"decode worker {self.name} is shutting down")
            self._inbox.clear()
            for rid, res in list(self._reserved.items()):
                self._free(rid, res.blocks)
            self._reserved.clear()
        if self.behind is not None:
            self.behind.close()
