"""Request migration with real processes: a prefill and decode workers serving smollm2-135m
through a real store master, the real conductor in front. A decode worker killed with SIGKILL
mid-answer: the client's stream goes on on another decode worker, and its whole text equals an
uninterrupted run's (greedy); the new prefill reuses the blocks the dead worker wrote behind its
steps. Two kills in one answer: the same."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.http import jsonhttp
from tests.conftest import wait_for
from tests.helpers.prom import value
from tests.helpers.smollm import NAME
from tests.helpers.store_procs import Proc, start_master
from tests.helpers.worker_procs import WorkerProc

pytestmark = pytest.mark.timeout(900)
BLOCK = 16
PROMPT = ("Mooncake is the serving platform of Kimi. It keeps the KV cache at the centre: "
          "prefill and decode run on separate machines, and the cache moves between them. ")
BODY = {"model": NAME, "prompt": PROMPT, "max_tokens": 160, "temperature": 0,
        "ignore_eos": True, "stream": True}


class Cluster:
    def __init__(self) -> None:
        self.master: Proc = start_master(0)
        self.store = str(self.master.ready["address"])
        self.conductor = ConductorService(ConductorConfig(
            port=0, model=NAME, block_size=BLOCK, instance_ttl=30.0, request_timeout=60.0,
            max_migrations=3)).start()
        self.prefill = self.worker("prefill", "p0", "--segment-size", "256MiB")
        self.decodes: list[WorkerProc] = []

    def worker(self, role: str, name: str, *extra: str) -> WorkerProc:
        return WorkerProc(role, "--model", NAME, "--block-size", str(BLOCK), "--conductor",
                          self.conductor.url, "--heartbeat", "0.5", "--store", self.store,
                          "--name", name, "--threads", "1", *extra)

    def add_decodes(self, names: list[str]) -> list[WorkerProc]:
        new = [self.worker("decode", n, "--segment-size", "64MiB", "--kv-blocks", "256")
               for n in names]
        for w in new:
            w.ready(240)
        self.decodes += new
        wait_for(lambda: set(names) <= self.alive(), 60)
        return new

    def alive(self) -> set[str]:
        snap = jsonhttp.call(self.conductor.url + "/v1/instances").body["instances"]
        return {i["name"] for i in snap if i["alive"]}

    def running_on(self, candidates: list[WorkerProc]) -> WorkerProc:
        """The decode worker running the one request in flight."""
        found: list[WorkerProc] = []

        def look() -> bool:
            found[:] = [w for w in candidates if w.proc.poll() is None and
                        jsonhttp.call(w.url + "/v1/load").body.get("running", 0) > 0]
            return len(found) == 1
        wait_for(look, 60)
        return found[0]

    def metric(self, name: str) -> float:
        return value(jsonhttp.call(self.conductor.url + "/metrics").body["text"], name)

    def close(self) -> None:
        for w in [self.prefill, *self.decodes]:
            if w.proc.poll() is None:
                w.stop()
        self.conductor.close()
        self.master.stop()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        c.prefill.ready(240)
        yield c
    finally:
        c.close()


def text_of(chunks: list[dict[str, Any]]) -> str:
    assert not [c for c in chunks if "error" in c], chunks[-3:]
    return "".join(c["choices"][0].get("text") or "" for c in chunks if c.get("choices"))


def stream_killing(cluster: Cluster, at: list[int]) -> list[dict[str, Any]]:
    """Stream BODY; when the client has had `at[i]` tokens, SIGKILL the decode worker running
    the request (it must be running it then). The whole stream."""
    chunks: list[dict[str, Any]] = []
    tokens, kills = 0, list(at)
    for chunk in jsonhttp.events(cluster.conductor.url + "/v1/completions", BODY, timeout=600):
        chunks.append(chunk)
        if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
            tokens += 1
        if kills and tokens == kills[0]:
            kills.pop(0)
            victim = cluster.running_on(cluster.decodes)
            victim.proc.kill()
            victim.proc.wait(30)
    assert not kills, f"the answer ended before the kill at token {kills[0]}"
    return chunks


def reference(cluster: Cluster) -> tuple[str, int]:
    """The uninterrupted answer's text (not streamed) and its prompt's length in tokens."""
    ans = jsonhttp.call(cluster.conductor.url + "/v1/completions", BODY | {"stream": False},
                        timeout=600)
    assert ans.status == 200, ans.body
    return ans.body["choices"][0]["text"], ans.body["usage"]["prompt_tokens"]


def test_a_decode_worker_killed_mid_answer_moves_the_stream(cluster: Cluster) -> None:
    cluster.add_decodes(["d0", "d1"])
    want, prompt = reference(cluster)
    assert want
    at = random.Random(7).randrange(20, 60)
    got = stream_killing(cluster, [at])
    assert text_of(got) == want
    finals = [c for c in got if c.get("choices") and c["choices"][0].get("finish_reason")]
    assert [c["choices"][0]["finish_reason"] for c in finals] == ["length"]
    assert cluster.metric("mooncake_conductor_migrations_total") == 1
    # the new prefill loaded the prompt's blocks and at least one block of generated tokens
    # that the dead worker wrote behind its steps
    reused = cluster.metric("mooncake_conductor_migration_reused_tokens_total")
    assert reused > prompt // BLOCK * BLOCK


def test_two_kills_in_one_answer(cluster: Cluster) -> None:
    cluster.add_decodes(["d2", "d3"])
    want, _ = reference(cluster)
    before = cluster.metric("mooncake_conductor_migrations_total")
    got = stream_killing(cluster, [15, 70])
    assert text_of(got) == want
    assert cluster.metric("mooncake_conductor_migrations_total") == before + 2
