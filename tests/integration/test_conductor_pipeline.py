"""kvcache-pipeline live, with real processes: three `mooncake prefill` workers and a decode
worker of smollm2-135m, a real store master, the real conductor in front (one allowing 3
stages, one allowing 2, over the same workers). A long prompt's prefill runs as a pipeline of
layer stages across the prefill workers: the greedy answer equals transformers', with and
without a prefix reused from the store; the store then holds, bit for bit, the blocks a
single instance's prefill makes; a stage killed mid-prefill: its lead runs the request alone
and the answer is the same text, the dead stage is marked so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config import TransferConfig
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.http import jsonhttp
from mooncake_cli.kvkeys import block_keys
from mooncake_cli.registry import Registry
from mooncake_cli.store.client import StoreClient
from mooncake_cli.transfer.engine import TransferEngine
from tests.conftest import wait_for
from tests.helpers.prom import value
from tests.helpers.smollm import NAME, Reference, gguf_path
from tests.helpers.stage_ref import BLOCK, CHUNK, TOKENS, model, prompt, single
from tests.helpers.store_procs import Proc, start_master
from tests.helpers.worker_procs import WorkerProc

pytestmark = pytest.mark.timeout(1200)
NEW = 12
NAMES = ["p0", "p1", "p2"]


class Cluster:
    def __init__(self, folder: Path) -> None:
        self.master: Proc = start_master(0)
        self.store = str(self.master.ready["address"])
        self.prefill = {n: self.worker("prefill", n, "--segment-size", "256MiB",
                                       "--kv-blocks", "600") for n in NAMES}
        self.decode = self.worker("decode", "d0", "--segment-size", "64MiB",
                                  "--kv-blocks", "600")
        self.conductors: dict[int, ConductorService] = {}
        self.explain: dict[int, Path] = {}
        for stages in (2, 3):
            self.explain[stages] = folder / f"explain-{stages}.jsonl"
            self.conductors[stages] = self.conductor(stages)

    def worker(self, role: str, name: str, *extra: str) -> WorkerProc:
        # the workers' chunk is the pipeline's: the blocks are then a single instance's,
        # bit for bit (engine/stages.py)
        return WorkerProc(role, "--model", NAME, "--block-size", str(BLOCK), "--store",
                          self.store, "--name", name, "--threads", "1",
                          "--chunk-size", str(CHUNK), *extra)

    def conductor(self, stages: int) -> ConductorService:
        for w in [*self.prefill.values(), self.decode]:
            w.ready(240)
        return ConductorService(ConductorConfig(
            port=0, model=NAME, block_size=BLOCK, policy="kvcache-pipeline",
            max_stages=stages, pipeline_chunk=CHUNK, pipeline_min_gain=0.1,
            prefill=tuple(w.url for w in self.prefill.values()), decode=(self.decode.url,),
            explain=str(self.explain[stages]), request_timeout=120.0,
            instance_ttl=60.0)).start()

    def complete(self, stages: int, ids: list[int]) -> dict[str, Any]:
        body = {"model": NAME, "prompt": ids, "max_tokens": NEW, "temperature": 0,
                "ignore_eos": True}
        ans = jsonhttp.call(self.conductors[stages].url + "/v1/completions", body, timeout=900)
        assert ans.status == 200, ans.body
        return ans.body

    def placements(self, stages: int) -> list[dict[str, Any]]:
        path = self.explain[stages]
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def metric(self, stages: int, name: str) -> float:
        text = jsonhttp.call(self.conductors[stages].url + "/metrics").body["text"]
        return value(text, name)

    def alive(self, stages: int) -> set[str]:
        snap = jsonhttp.call(self.conductors[stages].url + "/v1/instances").body["instances"]
        return {i["name"] for i in snap if i["alive"]}

    def close(self) -> None:
        for c in self.conductors.values():
            c.close()
        for w in [*self.prefill.values(), self.decode]:
            if w.proc.poll() is None:
                w.stop()
        self.master.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("pipeline"))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def reference() -> Reference:
    return Reference(gguf_path())


def text_of(reference: Reference, ids: list[int]) -> str:
    return str(reference.tokenizer.decode(reference.greedy(ids, NEW)))


def pipeline_of(cluster: Cluster, stages: int, before: int) -> dict[str, Any]:
    """The pipeline of the one placement made after the first `before` ones."""
    records = cluster.placements(stages)[before:]
    assert len(records) == 1, records
    piped = records[0].get("pipeline")
    assert piped is not None, f"not pipelined: {records[0]}"
    return dict(piped)


def stored_blocks(cluster: Cluster, ids: list[int]) -> list[bytes]:
    engine = TransferEngine(TransferConfig(), Registry.from_env())
    try:
        with StoreClient(cluster.store, engine, 0, timeout=10) as store:
            keys = block_keys(ids, model().namespace(BLOCK))[:len(ids) // BLOCK]
            return [store.get(k) for k in keys]
    finally:
        engine.close()


def test_three_stages_answer_as_transformers_and_store_single_instance_blocks(
        cluster: Cluster, reference: Reference) -> None:
    ids = list(prompt(TOKENS))
    before = len(cluster.placements(3))
    ans = cluster.complete(3, ids)
    piped = pipeline_of(cluster, 3, before)
    assert len(piped["stages"]) == 2 and piped["chunk_tokens"] == CHUNK
    # both estimates: the pipeline was chosen because it beat the best single instance
    assert piped["single"]["stages"] == [] and piped["ttft_s"] < piped["single"]["ttft_s"]
    assert cluster.metric(3, "mooncake_conductor_pipelined_total") == 1
    assert ans["choices"][0]["text"] == text_of(reference, ids)
    want = [b.contiguous().numpy().tobytes() for b in single(TOKENS, 0)[1]]
    got = stored_blocks(cluster, ids)
    assert len(got) == TOKENS // BLOCK
    for i, data in enumerate(got):
        assert data == want[i], f"stored block {i} differs from a single instance's"


def test_two_stages_after_a_prefix_reused_from_the_store(
        cluster: Cluster, reference: Reference) -> None:
    reused = 640  # 40 blocks of an earlier prompt through this conductor; the rest is new
    head = list(prompt(3000))[1000:2000]  # text no earlier request began with
    cluster.complete(2, head)  # this conductor learns which worker holds its blocks
    ids = head[:reused] + list(prompt(3000))[2000:2800]
    before = len(cluster.placements(2))
    counted = cluster.metric(2, "mooncake_conductor_pipelined_total")
    ans = cluster.complete(2, ids)
    piped = pipeline_of(cluster, 2, before)
    assert len(piped["stages"]) == 1
    assert ans["usage"]["prompt_tokens_details"]["cached_tokens"] == reused
    assert cluster.metric(2, "mooncake_conductor_pipelined_total") == counted + 1
    assert ans["choices"][0]["text"] == text_of(reference, ids)


def test_stage_killed_mid_prefill_lead_answers_alone(cluster: Cluster,
                                                     reference: Reference) -> None:
    """Runs last: it kills a prefill worker."""
    import threading

    ids = list(prompt(3000))[:2400]
    before = len(cluster.placements(2))
    result: dict[str, Any] = {}
    sender = threading.Thread(target=lambda: result.update(cluster.complete(2, ids)))
    sender.start()
    wait_for(lambda: len(cluster.placements(2)) > before, 120, what="the placement")
    [stage] = pipeline_of(cluster, 2, before)["stages"]
    victim = cluster.prefill[stage]

    def running() -> bool:
        return bool(jsonhttp.call(victim.url + "/v1/load").body.get("running"))
    wait_for(running, 120, what="the stage at work")
    victim.proc.kill()
    victim.proc.wait(30)
    sender.join(900)
    assert not sender.is_alive(), "the request did not end"
    assert result["choices"][0]["text"] == text_of(reference, ids)
    assert cluster.metric(2, "mooncake_conductor_pipeline_fallbacks_total") == 1
    assert stage not in cluster.alive(2)
