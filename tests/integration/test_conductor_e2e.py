"""The whole serving path through the official `openai` client: a conductor in front of a real
store master, 2 prefill and 1 decode worker processes on a tiny random Llama checkpoint.

Outputs must equal a single-process greedy run of the same checkpoint; a prefill worker killed
mid-run must cost no request (rerouted to the other one).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.http import jsonhttp
from tests.helpers.prom import value
from tests.helpers.store_procs import start_master
from tests.helpers.tiny_models import write_model
from tests.helpers.worker_procs import WorkerProc

pytest.importorskip("transformers")
BLOCK = 8
PROMPTS = [[0, 17, 29, 41, 53, 67, 79, 83, 97, 101, 113, 127, 131, 139, 149, 151, 163, 173],
           [0, 5, 9, 14, 88, 121, 203, 250, 12, 7, 44, 61, 99, 2, 33]]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    model = write_model(tmp_path_factory.mktemp("ckpt") / "tiny-llama", "llama", seed=3)
    master = start_master(0)
    addr = master.ready["address"]
    common = ["--model", str(model), "--store", addr, "--block-size", str(BLOCK),
              "--kv-blocks", "256", "--segment-size", "16MiB"]
    procs = [WorkerProc("prefill", *common, "--name", f"p{i}") for i in range(2)]
    procs.append(WorkerProc("decode", *common, "--name", "d0"))
    try:
        for p in procs:
            p.ready()
        cfg = ConductorConfig(port=0, model=str(model), block_size=BLOCK, policy="round-robin",
                              prefill=tuple(p.url for p in procs[:2]), decode=(procs[2].url,),
                              instance_ttl=3.0, poll_interval=0.5)
        svc = ConductorService(cfg).start()
        yield {"svc": svc, "model": model, "procs": procs}
        svc.close()
    finally:
        for p in procs:
            p.stop()
        master.stop()


def metric(text: str, name: str) -> float:
    return value(text, f"mooncake_conductor_{name}")


def reference(model: Path, prompt: list[int], n: int) -> str:
    from mooncake_cli.engine import ModelRunner, SamplingParams, load_model
    from mooncake_cli.engine.kvcache import KVCache

    m = load_model(model)
    runner = ModelRunner(m, KVCache(m.namespace(BLOCK), 64))
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    [seq] = runner.generate([prompt], params)
    return m.tokenizer.decode(seq.output_ids)


def test_openai_client_equals_single_process_and_survives_a_dead_prefill(cluster: dict) -> None:
    svc: ConductorService = cluster["svc"]
    client = openai.OpenAI(base_url=svc.url + "/v1", api_key="none", max_retries=0,
                           timeout=120)
    name = svc.conductor.model.name
    extra = {"ignore_eos": True}
    for prompt in PROMPTS:
        want = reference(cluster["model"], prompt, 12)
        got = client.completions.create(model=name, prompt=prompt, max_tokens=12,
                                        temperature=0, extra_body=extra)
        assert got.choices[0].text == want
        assert got.usage is not None and got.usage.completion_tokens == 12
        stream = client.completions.create(model=name, prompt=prompt, max_tokens=12,
                                           temperature=0, stream=True, extra_body=extra)
        chunks = list(stream)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want
        assert chunks[-1].choices[0].finish_reason == "length"
        # round-robin: the third send lands where the first stored the prompt's blocks
        third = client.completions.create(model=name, prompt=prompt, max_tokens=12,
                                          temperature=0, extra_body=extra)
        assert third.choices[0].text == want
        assert third.usage is not None and third.usage.prompt_tokens_details is not None
        assert third.usage.prompt_tokens_details.cached_tokens >= BLOCK
        assert got.usage.prompt_tokens_details.cached_tokens == 0  # the first, cold send
    chat = client.chat.completions.create(model=name, max_tokens=6, temperature=0,
                                          messages=[{"role": "user", "content": "hello"}])
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.completion_tokens >= 1
    # the third sends reused the blocks the first ones stored on the same instance
    metrics = jsonhttp.call(svc.url + "/metrics").body["text"]
    assert metric(metrics, "prefix_hit_tokens_total") >= BLOCK

    cluster["procs"][0].proc.kill()  # p0 dies: round-robin still sends it every other request
    cluster["procs"][0].proc.wait()
    for _ in range(3):
        got = client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=12,
                                        temperature=0, extra_body=extra)
        assert got.choices[0].text == reference(cluster["model"], PROMPTS[0], 12)
    listed = {i["name"]: i["alive"] for i in
              jsonhttp.call(svc.url + "/v1/instances").body["instances"]}
    assert listed == {"p0": False, "p1": True, "d0": True}
    metrics = jsonhttp.call(svc.url + "/metrics").body["text"]
    assert metric(metrics, "rerouted_total") >= 1
