"""Fetch or recompute, and prefetch, on a real testbed: a prefix held by a prefill worker on host
a, fetched by real prefill workers on b (10 Gbit to a) and c (100 Mbit to a) through the store,
their transfer engines reporting what the fetch took (`PrefillAnswer.fetched`); the conductor
learns each link's bandwidth from those answers and then recomputes the prefix over the slow
link and fetches it over the fast one. A worker on c asked to prefetch the prefix (as the
conductor asks while a request waits) then prefills reading none of it over the link.

Not covered here: the conductor placing these requests itself over HTTP (the test has b and c
fetch, as the conductor's decision to fetch would, and hands their answers to it).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from typing import Any

import pytest

from mooncake_cli.api.roles import PrefillAnswer
from mooncake_cli.api.schema import validate
from mooncake_cli.conductor.instances import Instances
from mooncake_cli.conductor.live import Conductor
from mooncake_cli.conductor.live_metrics import ConductorMetrics
from mooncake_cli.conductor.served import ServedModel
from mooncake_cli.kvkeys import KVNamespace
from mooncake_cli.scheduler.online_cost import OnlineCostModel
from mooncake_cli.scheduler.scheduler import Scheduler, make_policy
from mooncake_cli.scheduler.state import Cluster, Request
from mooncake_cli.testbed import bed as testbed_bed
from mooncake_cli.testbed.state import Testbed
from tests.helpers import link_worker, testbed
from tests.helpers.procs import read_line
from tests.helpers.store_procs import REPO

pytestmark = pytest.mark.timeout(300)
bed = testbed.fixture("a,b,c", "a-b=10gbit,a-c=100mbit")
NS = KVNamespace("demo", "float32", link_worker.BLOCK, 4, 2, 32)  # the demo model's KV


def in_host(tb: Testbed, host: str, args: list[str], secret: str) -> subprocess.Popen[bytes]:
    argv, env = testbed_bed.exec_argv(tb, host, [sys.executable, "-m",
                                                 "tests.helpers.link_worker", *args])
    return subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, **env, "MOONCAKE_SECRET": secret})


def fetch(tb: Testbed, host: str, master: str, secret: str, mode: str = "fetch"
          ) -> dict[str, Any]:
    proc = in_host(tb, host, [mode, master], secret)
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"the worker on {host} failed"
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


def test_recompute_over_100mbit_and_fetch_over_10gbit(bed: Testbed) -> None:
    secret = secrets.token_hex(16)
    holder = in_host(bed, "a", ["hold"], secret)
    try:
        held = read_line(holder, 240)
        answers = {h: fetch(bed, h, held["master"], secret) for h in ("b", "c")}
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(60)
    keys = held["answer"]["stored_keys"]
    assert len(keys) == 16
    for h, answer in answers.items():  # each read the whole prefix from a's segment
        assert answer["cached_tokens"] == 16 * link_worker.BLOCK, (h, answer)
        assert [f["segment"] for f in answer["fetched"]] == [held["segment"]], (h, answer)
        assert answer["fetched"][0]["bytes"] == 16 * NS.block_bytes, (h, answer)
    rate = {h: a["fetched"][0]["bytes"] / a["fetched"][0]["seconds"] for h, a in answers.items()}
    # about the link's rate: its bucket refills between the reads of blocks (the store's
    # lookups in between do not count), letting each block's first bytes burst
    assert rate["c"] < 2 * 100e6 / 8, rate
    assert rate["b"] > 5 * rate["c"], rate
    print(f"measured: a->b {rate['b'] / 1e6:.1f} MB/s, a->c {rate['c'] / 1e6:.1f} MB/s")
    req = Request("r", link_worker.PROMPT_TOKENS, 1, keys)

    # the conductor had b and c fetch (its prior, 1 Gbit, says fetching pays) and learns
    # each link from their answers
    learning = cluster(keys)
    conductor = Conductor(ServedModel("demo", None, NS, 4096),
                          Scheduler(learning, make_policy("kvcache-centric")),
                          Instances(learning, 30.0, link_worker.BLOCK), ConductorMetrics())
    try:
        for h, other in (("b", "c"), ("c", "b")):
            learning.by_name[other].alive = False
            decision = conductor.scheduler.schedule(req, 0.0)
            assert decision.prefill == h and decision.placement.chosen.fetch_from == "holder"
            conductor.bookings.learn(h, keys, validate(PrefillAnswer, answers[h]), decision)
            assert learning.index.prefix_len(h, keys) == 16  # the replicas its fetch left
            learning.index.drop(h)  # the next fetch is again from the holder alone
            learning.by_name[other].alive = True
    finally:
        conductor.close()
    links = learning.links
    assert links.get("holder", "b") == pytest.approx(rate["b"])
    assert links.get("holder", "c") == pytest.approx(rate["c"])

    # with the measured links: c recomputes the prefix, b fetches it
    placing = cluster(keys)
    placing.links = links
    sched = Scheduler(placing, make_policy("kvcache-centric"))
    by = {c.instance: c for c in sched.schedule(req, 0.0, explain=True).placement.candidates}
    assert by["b"].fetch_blocks == 16 and by["c"].fetch_blocks == 0
    assert by["c"].weighed is not None and by["c"].weighed.measured
    assert by["c"].weighed.fetch_s > by["c"].weighed.recompute_s
    for slow, fast in (("c", "b"), ("b", "c")):
        placing.by_name[slow].busy_until = 1e9
        chosen = sched.schedule(req, 0.0).placement.chosen
        assert chosen.instance == fast
        assert chosen.fetch_blocks == (16 if fast == "b" else 0), chosen
        placing.by_name[slow].busy_until = 0.0


def test_a_prefetched_prefix_is_read_locally(bed: Testbed) -> None:
    """c (100 Mbit from a) pulls the prefix a holds while the request would wait; its prefill
    then reads none of it over the link."""
    secret = secrets.token_hex(16)
    holder = in_host(bed, "a", ["hold"], secret)
    try:
        held = read_line(holder, 240)
        got = fetch(bed, "c", held["master"], secret, "prefetch")
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(60)
    pull, answer = got["prefetch"], got["answer"]
    assert (pull["state"], pull["held"], pull["pulled"]) == ("done", 0, 16), pull
    assert pull["bytes"] == 16 * NS.block_bytes and pull["reason"] == "queue"
    assert answer["prefetched"] == 16 and answer["cached_tokens"] == 16 * link_worker.BLOCK
    assert answer["fetched"] == [], answer
    assert answer["first_token"] == held["answer"]["first_token"]


def cluster(keys: list[str]) -> Cluster:
    """holder (busy: its queue rules it out) holds the prefix; b and c hold none. The cost
    model's bandwidth, 1 Gbit, is the prior; recomputing the prefix's 1024 tokens costs 0.1 s,
    so fetching its 2 MiB pays only above ~170 Mbit/s."""
    c = Cluster(OnlineCostModel(block_tokens=link_worker.BLOCK, kv_bytes_per_token=2048,
                                bandwidth=1e9 / 8, per_token_s=1e-4, overhead_s=0.0))
    for name in ("holder", "b", "c"):
        c.add(name, "prefill")
    c.by_name["holder"].busy_until = 1e9
    c.index.store("holder", keys)
    return c
