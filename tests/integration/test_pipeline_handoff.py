"""Pipeline stages in separate processes, handing off through the transfer engine: the test
process leads (tokens, reused prefix, first token) and runs the first layers; two stage
processes run the rest. The first token's logits and every block's KV of every layer in the
lead's cache afterwards equal a single instance's bit for bit (so the blocks it stores and
streams are a single instance's), through 2 and 3 stages, with and without a reused prefix;
a stage killed mid-prefill fails the prefill at once, and the lead and the surviving stage
serve the next request."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

import pytest

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.engine import ModelRunner, Sequence
from mooncake_cli.engine.stages import StageRunner, split_layers
from mooncake_cli.worker.pipeline_lead import LeadTiming, lead_prefill
from tests.helpers.stage_procs import Hosted, StageProc, hosted
from tests.helpers.stage_ref import (
    BLOCK,
    CHUNK,
    PREFIX,
    TOKENS,
    Result,
    assert_same,
    model,
    prompt,
    single,
)

pytestmark = pytest.mark.timeout(900)
SECRET = "pipeline-handoff-secret"
IDS = itertools.count()


class Cluster:
    def __init__(self, lead: Hosted, procs: list[StageProc]) -> None:
        self.lead, self.procs = lead, procs

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.procs]


@pytest.fixture(scope="module", params=["tcp"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    procs = [StageProc(SECRET, request.param) for _ in range(2)]
    try:
        with hosted(SECRET, request.param) as lead:
            for p in procs:
                p.ready()
                assert lead.host.engine.transport_for(p.segment) == request.param
            yield Cluster(lead, procs)
    finally:
        for p in procs:
            p.stop()


def lead_run(c: Cluster, stages: int, prefix: int, urls: list[str] | None = None,
             on_blocks: Callable[[int], None] | None = None
             ) -> tuple[Result, int, LeadTiming]:
    """A pipelined prefill led by the test process; (logits and whole blocks, first token,
    the lead's timing)."""
    host = c.lead.host
    seq = Sequence(list(prompt(TOKENS)))
    if prefix:  # as PrefillWorker loads it from the store: whole blocks in the lead's cache
        host.cache.ensure(seq.block_table, prefix)
        for b, data in zip(seq.block_table, single(TOKENS, 0)[1], strict=False):
            host.cache.import_block(b, data)
        seq.num_computed = prefix
    ranges = split_layers(model().config.num_layers, stages)
    timing = LeadTiming()
    try:
        token = lead_prefill(host, seq, (urls or c.urls)[:stages - 1], ranges, CHUNK,
                             c.lead.url, f"pipe-{next(IDS)}",
                             on_blocks=on_blocks, timing=timing)
        full = StageRunner(model(), host.cache, range(model().config.num_layers))
        logits = full.logits(host.inbox.rows[TOKENS - 1])
        blocks = [host.cache.block(b).clone() for b in seq.block_table]
    finally:
        host.cache.release(seq.block_table)
    return (logits, blocks), token, timing


@pytest.mark.parametrize("stages", [3, 2])
@pytest.mark.parametrize("prefix", [0, PREFIX], ids=["fresh", "reused-prefix"])
def test_stages_across_processes_equal_single_instance(cluster: Cluster, stages: int,
                                                       prefix: int) -> None:
    seen: list[int] = []
    got, token, timing = lead_run(cluster, stages, prefix, on_blocks=seen.append)
    want = single(TOKENS, prefix)
    assert_same(got, want)
    assert token == int(want[0].argmax())
    # the last stage's notices make blocks whole in order, up to every block of the prompt
    assert seen == sorted(seen) and seen[-1] == len(want[1]) and seen[0] > prefix // BLOCK
    hidden = model().config.hidden_size * 4
    computed = TOKENS - prefix
    assert timing.bytes_sent >= computed * hidden  # the lead's rows to the second stage
    assert cluster.lead.host.cache.allocator.free == cluster.lead.host.cache.num_blocks


def test_a_stage_killed_mid_prefill_fails_it_at_once(cluster: Cluster) -> None:
    """The last of 3 stages is killed once its first chunk is back at the lead: the second
    stage cannot hand off, tells the lead, and the prefill fails well before any timeout;
    the lead then prefills on one instance (what the conductor's retry does) and gets the
    single instance's token, and the surviving stage serves a 2-stage prefill."""
    victim = cluster.procs[1]

    def kill_once(done: int) -> None:
        if victim.proc.poll() is None:
            victim.kill()

    t0 = time.monotonic()
    with pytest.raises(ServingError) as err:
        lead_run(cluster, 3, 0, on_blocks=kill_once)
    assert err.value.code is ErrorCode.PREFILL_FAILED
    assert "no chunk from the previous stage" not in str(err.value), "failed by a timeout"
    assert time.monotonic() - t0 < cluster.lead.host.timeout
    host = cluster.lead.host
    runner = ModelRunner(model(), host.cache, chunk_size=CHUNK)
    [seq] = [runner.new_sequence(list(prompt(TOKENS)))]
    assert runner.prefill(seq) == int(single(TOKENS, 0)[0].argmax())
    runner.release(seq)
    got, _, _ = lead_run(cluster, 2, 0, urls=cluster.urls[:1])
    assert_same(got, single(TOKENS, 0))
