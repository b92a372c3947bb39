"""Pipelined prefills between prefill workers in this process (demo model, cluster secret):
the lead's first token is the one it computes alone; a stage that is running a prefill of its
own refuses the plan and the lead runs the request alone, saying why; a lead waits for a stage
job on its own worker to end; the stage routes refuse callers without the secret and answer
malformed plans with 400."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_cli.config import TransferConfig
from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.http.auth import new_secret, signer
from mooncake_cli.http.jsonhttp import call
from mooncake_cli.registry import Registry
from mooncake_cli.worker.prefill import PrefillWorker
from tests.conftest import wait_for
from tests.helpers.prom import value

pytestmark = pytest.mark.timeout(300)
SECRET = new_secret()
AUTH = signer(SECRET)
PROMPT = [256, *(b"pipelined prefill across workers keeps every block whole " * 6)]


@pytest.fixture(scope="module")
def workers() -> Iterator[list[PrefillWorker]]:
    made: list[PrefillWorker] = []
    try:
        for _ in range(3):
            made.append(PrefillWorker(WorkerConfig(role="prefill", block_size=8, chunk_size=64,
                                                   kv_blocks=256),
                                      TransferConfig(secret=SECRET), Registry.from_env()).start())
        yield made
    finally:
        for w in made:
            w.close()


def prefill(w: PrefillWorker, rid: str, stages: list[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"request_id": rid, "token_ids": PROMPT}
    if stages is not None:
        body["pipeline"] = {"stages": stages, "chunk_tokens": 64}
    ans = call(w.url + "/v1/prefill", body, timeout=120, auth=AUTH)
    assert ans.status == 200, ans.body
    return ans.body


def test_pipelined_first_token_is_the_single_instances(workers: list[PrefillWorker]) -> None:
    alone = prefill(workers[0], "alone")
    assert alone["pipeline"] is None
    for stages in ([workers[1].url], [workers[1].url, workers[2].url]):
        got = prefill(workers[0], f"piped-{len(stages)}", stages)
        report = got["pipeline"]
        assert report["fallback"] == "", report
        assert report["stages"] == [workers[0].url, *stages]
        assert report["layers"][0][0] == 0 and report["layers"][-1][1] == 4
        assert report["bytes_sent"] > 0
        assert got["first_token"] == alone["first_token"]


def test_a_stage_busy_with_its_own_prefill_leaves_the_lead_alone(
        workers: list[PrefillWorker]) -> None:
    lead, stage = workers[0], workers[1]
    alone = prefill(lead, "alone-2")
    with stage.pipelines.local_work():  # as while the stage's worker runs its own prefill
        got = prefill(lead, "taken", [stage.url])
    report = got["pipeline"]
    assert report["stages"] == [] and "prefill of its own" in report["fallback"], report
    assert got["first_token"] == alone["first_token"]
    text = call(lead.url + "/metrics").body["text"]
    assert value(text, "mooncake_worker_pipeline_fallbacks_total", role="prefill") == 1
    # the first test's two
    assert value(text, "mooncake_worker_pipelined_prefills_total", role="prefill") == 2


def plan(url: str, rid: str = "x") -> dict[str, Any]:
    """A stage plan whose chunks never come (its targets are never written to)."""
    return {"request_id": rid, "num_tokens": 10, "start": 0, "lo": 1, "hi": 2,
            "lead_url": url, "next_url": url, "next_inbox": {"segment": "s"}, "next_rows": 0,
            "last": True, "gather": {"segment": "s"}, "gather_at": [0, 0]}


def test_own_prefill_waits_for_the_stage_job_on_its_worker(
        workers: list[PrefillWorker]) -> None:
    w = workers[1]
    want = prefill(w, "w-alone")["first_token"]
    host = w.pipelines.host
    assert host is not None
    assert call(w.url + "/v1/stage/begin", plan(w.url, "held"), auth=AUTH).status == 200
    assert host.job is not None and w.load()["running"] == 1  # a stage counts as running
    results: dict[str, Any] = {}
    own = threading.Thread(target=lambda: results.update(own=prefill(w, "w-own")))
    own.start()
    wait_for(lambda: w.load()["waiting"] == 0 and w._busy == 1, 60, what="the prefill taken")
    # its prefill thread has the request, and waits: the host is not held for it yet
    assert not host.local and "own" not in results and host.job is not None
    assert call(w.url + "/v1/stage/release", {"request_id": "held", "reason": "test"},
                auth=AUTH).status == 200
    own.join(60)
    assert results["own"]["first_token"] == want and host.job is None


def test_stage_routes_need_the_secret_and_refuse_bad_plans(
        workers: list[PrefillWorker]) -> None:
    url = workers[2].url
    for path in ("/v1/stage/begin", "/v1/stage/chunk", "/v1/stage/release"):
        assert call(url + path, plan(url)).status == 401, path
    bad = call(url + "/v1/stage/begin", plan(url) | {"gather_at": [0]}, auth=AUTH)
    assert bad.status == 400 and "gather_at" in bad.body["error"]["message"], bad.body
    bad = call(url + "/v1/stage/begin", plan(url) | {"hi": 99}, auth=AUTH)
    assert bad.status == 400, bad.body
    assert call(url + "/v1/stage/chunk", {"request_id": "nobody", "start": 0, "n": 1},
                auth=AUTH).status == 404
    refused = call(workers[0].url + "/v1/prefill",
                   {"request_id": "r", "token_ids": PROMPT,
                    "pipeline": {"stages": ["not a url"]}}, auth=AUTH)
    assert refused.status == 400 and refused.body["error"]["param"] == "pipeline"
    assert workers[2].pipelines.host is not None and workers[2].pipelines.host.job is None
