"""StageHost: an instance serving one pipeline stage at a time (worker/pipeline.py).

    POST /v1/stage/begin    StagePlan -> StageGrant (blocks taken, inbox open)
    POST /v1/stage/chunk    ChunkReady (rows of the prompt are in the inbox)
    POST /v1/stage/release  StageRelease (the lead gives up: stop, free the blocks; or, to
                            the lead, a stage failed: its prefill fails at once)

The same host's inbox takes the notices of a request it leads (pipeline_lead.py), so one
instance serves either role. A prefill worker runs its own prefills inside `local_work()`:
one of them waits for a stage job to end, and a stage plan that comes meanwhile is refused
(UNAVAILABLE), so its lead runs the request alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.api.schema import parse
from mooncake_cli.engine import CacheFull, KVCache, Model, ModelError, Sequence
from mooncake_cli.engine.stages import StageRunner
from mooncake_cli.http.auth import Signer
from mooncake_cli.http.server import body
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region
from mooncake_cli.worker.pipeline import (
    ChunkReady,
    Inbox,
    Outbox,
    StageGrant,
    StagePlan,
    StageRelease,
    Target,
    notify,
    post,
    run,
    write,
)

log = logging.getLogger("mooncake.worker")


@dataclass
class StageJob:
    plan: StagePlan
    runner: StageRunner
    seq: Sequence
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class StageHost:
    """Runs stages of `model` over `cache` (its KV pool registered with `engine`, guarded,
    unless the caller passes `pool_region`); prompts of up to `max_tokens` tokens."""

    def __init__(self, model: Model, cache: KVCache, engine: TransferEngine,
                 auth: Signer | None = None, max_tokens: int | None = None,
                 pool_region: Region | None = None, timeout: float = 30.0) -> None:
        self.model, self.cache, self.engine, self.auth = model, cache, engine, auth
        self.timeout = timeout
        rows = max_tokens or model.config.max_position
        hidden, dtype = model.config.hidden_size, model.dtype
        self.pool_region = pool_region or engine.register(cache.pool, guarded=True)
        self.inbox = Inbox(engine, rows, hidden, dtype, cache.pool.device)
        self.outbox = Outbox(engine, rows, hidden, dtype, cache.pool.device)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a stage job ends
        self.job: StageJob | None = None
        self.local = False  # the host's own prefill is running (see local_work)
        self.bytes_sent = 0

    def slice_at(self, block: int, layers: range) -> int:
        """Where layers `layers` of pool block `block` lie in this engine's segment."""
        return (self.pool_region.base + block * self.cache.block_bytes
                + (layers.start - self.cache.layers.start) * self.cache.layer_bytes)

    # -- the control messages ----------------------------------------------------------------
    def begin(self, plan: StagePlan) -> StageGrant:
        bs = self.cache.block_size
        if plan.start % bs or plan.start >= plan.num_tokens:
            raise ServingError(ErrorCode.INVALID_REQUEST, f"a reused prefix of {plan.start} "
                               f"tokens is not whole {bs}-token blocks of the prompt")
        if len(plan.gather_at) != self.cache.blocks_for(plan.num_tokens):
            raise ServingError(ErrorCode.INVALID_REQUEST, "gather_at must name every block")
        try:
            runner = StageRunner(self.model, self.cache, range(plan.lo, plan.hi))
            seq = runner.new_sequence(plan.num_tokens)
        except ModelError as e:
            raise ServingError(ErrorCode.INVALID_REQUEST, str(e)) from None
        inbox = self.claim(plan.request_id, plan.num_tokens)
        try:
            self.cache.ensure(seq.block_table, plan.num_tokens)
        except CacheFull as e:
            self.inbox.close(plan.request_id)
            raise ServingError(ErrorCode.KV_FULL, str(e), retry_after=1) from None
        seq.num_computed = plan.start
        slices = [self.slice_at(b, runner.layers) for b in seq.block_table[:plan.start // bs]]
        # the lead's prefix slices land in these blocks: the capability covers them too
        inbox = self.inbox.open(plan.request_id, plan.num_tokens,
                                [(s, runner.slice_bytes) for s in slices])
        with self._lock:
            self.job = StageJob(plan, runner, seq)
        threading.Thread(target=self._serve, args=(self.job,), daemon=True,
                         name=f"mooncake-stage-{plan.lo}-{plan.hi}").start()
        return StageGrant(request_id=plan.request_id, inbox=inbox,
                          rows=self.inbox.region.base, row_bytes=self.inbox.row_bytes,
                          slices=slices, slice_bytes=runner.slice_bytes)

    def claim(self, request_id: str, num_tokens: int,
              extra: list[tuple[int, int]] | None = None, lead: bool = False) -> Target:
        """Take the inbox for `request_id` (as a stage, or, with `lead`, as its lead from
        inside `local_work`); UNAVAILABLE while another request has it. The capability for
        its rows and `extra` ranges."""
        with self._lock:
            if self.job is not None or self.inbox.request_id is not None:
                raise ServingError(ErrorCode.UNAVAILABLE, "this instance is running a "
                                   "pipelined prefill", retry_after=1)
            if self.local and not lead:
                raise ServingError(ErrorCode.UNAVAILABLE, "this instance is running a "
                                   "prefill of its own", retry_after=1)
            return self.inbox.open(request_id, num_tokens, extra or [])

    @contextmanager
    def local_work(self) -> Iterator[None]:
        """Hold the host for a prefill of its own: wait for a running stage job to end, and
        refuse stage plans until the block ends."""
        with self._idle:
            self._idle.wait_for(lambda: self.job is None)
            self.local = True
        try:
            yield
        finally:
            with self._lock:
                self.local = False

    def deliver(self, notice: ChunkReady) -> None:
        self.inbox.post(notice)

    def release(self, message: StageRelease) -> None:
        """Stop the request's stage (its loop frees its blocks) or fail the prefill it leads;
        nothing when it is not here."""
        self.inbox.close(message.request_id, message.reason or "released")

    # -- the stage loop ------------------------------------------------------------------------
    def _serve(self, job: StageJob) -> None:
        plan = job.plan
        try:
            self._run(job)
        except BaseException as e:
            job.error = e
            log.warning("pipeline stage of %s failed: %s", plan.request_id, e)
        finally:
            job.runner.release(job.seq)
            with self._lock:  # free for the next claim all at once
                self.inbox.close(plan.request_id)
                self.job = None
                self._idle.notify_all()
            job.done.set()
        if job.error is not None:  # free already: the lead may retry on this instance at once
            why = StageRelease(request_id=plan.request_id,
                               reason=f"stage {plan.lo}-{plan.hi} failed: {job.error}")
            try:
                post(plan.lead_url, "/v1/stage/release", why, self.auth, self.timeout)
            except ServingError as e:
                log.info("could not tell the lead of %s: %s", plan.request_id, e)

    def _run(self, job: StageJob) -> None:
        plan, seq, runner = job.plan, job.seq, job.runner
        bs = self.cache.block_size
        sent = plan.start // bs  # blocks whose slices the lead has (the reused ones: its own)
        gather = plan.gather
        while True:
            notice = self.inbox.take(self.timeout)
            if notice.start != seq.num_computed:
                raise ServingError(ErrorCode.PREFILL_FAILED, f"chunk at {notice.start}, "
                                   f"expected one at {seq.num_computed}")
            out = runner.step(seq, notice.n, self.inbox.take_rows(notice))
            final = seq.num_pending == 0
            if final != notice.final:
                raise ServingError(ErrorCode.PREFILL_FAILED, "the final chunk is misnamed")
            done = len(seq.block_table) if final else seq.num_computed // bs
            reqs = [write(self.pool_region, self.slice_at(seq.block_table[i], runner.layers)
                          - self.pool_region.base, runner.slice_bytes, gather,
                          plan.gather_at[i]) for i in range(sent, done)]
            sent = done
            if plan.last:  # the lead needs the prompt's last row only
                rows = out[-1:] if final else out[:0]
                first = plan.num_tokens - 1
            else:
                rows, first = out, notice.start
            if rows.shape[0]:
                at = self.outbox.stage(first, rows)
                reqs.append(write(self.outbox.region, at, rows.shape[0] * self.outbox.row_bytes,
                                  plan.next_inbox, plan.next_rows + at))
            self.bytes_sent += run(self.engine, reqs, self.timeout,
                                   f"stage {plan.lo}-{plan.hi} hand-off")
            notify(plan.next_url, notice, self.auth, self.timeout)
            if final:
                return


def stage_routes(host_of: Callable[[], StageHost]) -> list[Route]:
    """The control routes of the stage host `host_of()` returns (made after the routes, with
    the transfer engine; mount them behind the cluster secret's guard)."""

    def ok(data: object) -> Response:
        return JSONResponse(data.model_dump(mode="json") if hasattr(data, "model_dump")
                            else data)

    async def begin(request: Request) -> Response:
        return ok(host_of().begin(parse(StagePlan, await body(request))))

    async def chunk(request: Request) -> Response:
        host_of().deliver(parse(ChunkReady, await body(request)))
        return ok({"ok": True})

    async def release(request: Request) -> Response:
        host_of().release(parse(StageRelease, await body(request)))
        return ok({"ok": True})

    return [Route("/v1/stage/begin", begin, methods=["POST"]),
            Route("/v1/stage/chunk", chunk, methods=["POST"]),
            Route("/v1/stage/release", release, methods=["POST"])]


__all__ = ["StageHost", "StageJob", "Target", "stage_routes"]
