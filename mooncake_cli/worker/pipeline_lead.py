"""The lead of a pipelined prefill: it owns the request (tokens, reused prefix, first token),
runs the first layer range itself and drives the other stages (worker/pipeline.py).

    token = lead_prefill(host, seq, ["http://s2", "http://s3"], split_layers(30, 3), 512,
                         own_url="http://s1", on_blocks=stream_whole_blocks)

`seq` comes with its reused prefix already in the host's (full-layer) cache, as a single
instance's prefill loads it (PrefixStore.load); afterwards every block of the prompt is whole
in that cache, so storing it and streaming it to the decode worker stay as they are.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.api.schema import validate
from mooncake_cli.engine import Sequence
from mooncake_cli.engine.stages import StageRunner
from mooncake_cli.worker.pipeline import (
    ChunkReady,
    StageGrant,
    StagePlan,
    StageRelease,
    Target,
    notify,
    post,
    reachable,
    run,
    write,
)
from mooncake_cli.worker.stage_host import StageHost


@dataclass
class LeadTiming:
    """Seconds of the lead's own work, what it spent handing off, and its wait for the last
    stage after its own last chunk (the pipeline's drain)."""

    begin: float = 0.0
    prefix: float = 0.0
    compute: float = 0.0
    handoff: float = 0.0
    drain: float = 0.0
    bytes_sent: int = 0
    notices: list[float] = field(default_factory=list)  # when each of the last stage's came


def lead_prefill(host: StageHost, seq: Sequence, stages: list[str], ranges: list[range],
                 chunk: int, own_url: str, request_id: str,
                 on_blocks: Callable[[int], None] | None = None,
                 timing: LeadTiming | None = None,
                 sample: Callable[[Sequence, torch.Tensor], int] | None = None) -> int:
    """Prefill `seq` (from its `num_computed`) through this host (layers ranges[0]) and the
    stages at `stages` (ranges[1:], in order), `chunk` tokens at a time; the first token,
    drawn by `sample(seq, logits)` (default: the stage runner's sampler).
    `on_blocks(n)`: the first n blocks are whole in the host's cache (called as the last
    stage's notices come; n grows to every block of the prompt, the partial one included).
    PREFILL_FAILED (or UNAVAILABLE: a stage is busy) when the pipeline cannot finish; the
    caller may then run the request alone from `seq`'s reused prefix."""
    if not stages or len(ranges) != len(stages) + 1 or chunk < 1:
        raise ValueError("one layer range per stage (the lead's first), at least one other "
                         "stage, and chunk >= 1")
    t = timing or LeadTiming()
    cache, bs, n_tok = host.cache, host.cache.block_size, seq.num_prompt
    if cache.layers != range(host.model.config.num_layers):
        raise ServingError(ErrorCode.INVALID_REQUEST, "the lead's cache must hold every layer")
    runner = StageRunner(host.model, cache, ranges[0])
    reused = seq.num_computed // bs
    cache.ensure(seq.block_table, n_tok)
    table = seq.block_table
    whole = [(host.slice_at(b, cache.layers), cache.block_bytes) for b in table]
    # the last stage's row, every stage's slices
    mine = host.claim(request_id, n_tok, whole, lead=True)
    begun: list[str] = []
    try:
        clock = time.perf_counter()
        got: dict[int, StageGrant] = {}
        nxt, nxt_url, nxt_rows = mine, own_url, host.inbox.region.base
        for k in range(len(stages) - 1, -1, -1):  # last first: each plan names the next inbox
            r = ranges[k + 1]
            plan = StagePlan(request_id=request_id, num_tokens=n_tok, start=reused * bs,
                             lo=r.start, hi=r.stop, lead_url=own_url, next_url=nxt_url,
                             next_inbox=nxt, next_rows=nxt_rows, last=k == len(stages) - 1,
                             gather=mine, gather_at=[host.slice_at(b, r) for b in table])
            got[k] = validate(StageGrant, post(stages[k], "/v1/stage/begin", plan, host.auth,
                                               host.timeout))
            begun.append(stages[k])
            nxt, nxt_url, nxt_rows = got[k].inbox, stages[k], got[k].rows
        grants = [got[k] for k in range(len(stages))]
        t.begin = time.perf_counter() - clock
        clock = time.perf_counter()
        reqs = [write(host.pool_region, host.slice_at(b, ranges[k + 1]) - host.pool_region.base,
                      g.slice_bytes, g.inbox, g.slices[i])
                for k, g in enumerate(grants) for i, b in enumerate(table[:reused])]
        t.bytes_sent += run(host.engine, reqs, host.timeout, "shipping the reused prefix")
        t.prefix = time.perf_counter() - clock
        done = reused

        def arrived(notice: ChunkReady) -> None:
            nonlocal done
            t.notices.append(time.perf_counter())
            done = len(table) if notice.final else (notice.start + notice.n) // bs
            if on_blocks is not None:
                on_blocks(done)

        first = grants[0]
        while seq.num_pending:
            n, start = min(seq.num_pending, chunk), seq.num_computed
            clock = time.perf_counter()
            out = runner.step(seq, n)
            t.compute += time.perf_counter() - clock
            clock = time.perf_counter()
            at = host.outbox.stage(start, out)
            t.bytes_sent += run(host.engine, [write(host.outbox.region, at, n * first.row_bytes,
                                                    first.inbox, first.rows + at)],
                                host.timeout, "handing a chunk to the next stage")
            notify(stages[0], ChunkReady(request_id=request_id, start=start, n=n,
                                         final=seq.num_pending == 0), host.auth, host.timeout)
            t.handoff += time.perf_counter() - clock
            while (notice := host.inbox.poll()) is not None:
                arrived(notice)
        clock = time.perf_counter()
        while done < len(table):
            arrived(_next_notice(host, stages))
        t.drain = time.perf_counter() - clock
        logits = runner.logits(host.inbox.rows[n_tok - 1])
        return (sample or runner.sample)(seq, logits)
    except BaseException:
        for url in begun:  # best effort: a stage that is gone frees its blocks on its timeout
            try:
                post(url, "/v1/stage/release", StageRelease(request_id=request_id,
                                                            reason="the lead gave up"),
                     host.auth, host.timeout)
            except ServingError:
                pass
        raise
    finally:
        host.inbox.close(request_id)


def _next_notice(host: StageHost, stages: list[str], poll: float = 2.0) -> ChunkReady:
    """The next notice of the last stage, waiting up to the host's timeout in all; a stage
    that stops answering /health meanwhile fails the prefill at once (a killed stage sends
    nothing more, and a slow one must not be taken for it)."""
    deadline = time.monotonic() + host.timeout
    while True:
        left = deadline - time.monotonic()
        try:
            return host.inbox.take(max(0.0, min(poll, left)))
        except ServingError:
            if left <= poll or host.inbox.request_id is None:
                raise  # the time is up, or a stage told the lead it failed
        gone = [url for url in stages if not reachable(url)]
        if gone:
            raise ServingError(ErrorCode.PREFILL_FAILED, f"pipeline stage {gone[0]} stopped "
                               "answering")


__all__ = ["LeadTiming", "Target", "lead_prefill"]
