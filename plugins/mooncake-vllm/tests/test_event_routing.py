"""The conductor routes vLLM prefill workers on their KV events.

`mooncake conductor start --local 2,1 --engine vllm`: each prefill worker's vLLM publishes its
KV events (BlockStored, BlockRemoved) and the conductor follows them. A prompt sharing a long
prefix with an earlier one goes to the worker whose events say it holds that prefix, and vLLM
reports the tokens it found cached. When that worker's vLLM evicts the blocks (a small KV
cache, filled by other prompts sent to it directly), its removal events take them out of the
conductor's index, and the next decision counts nothing held there: it fetches the prefix from
the store instead, where vLLM's store connector saved it (the store master's own events).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mooncake_cli.conductor.event_routing import STORE
from mooncake_cli.http import jsonhttp
from mooncake_cli.http.auth import signer
from openai import OpenAI
from procs import poll
from prompts import long_prompt
from test_engine_vllm import MODEL, client, event, mooncake
from vllm_server import START_S

SECRET = "event-routing-test"
BS = 128
KV_BLOCKS = 65  # vLLM wants one whole context (8,192 tokens) to fit, and a block more
AUTH = signer(SECRET)


@pytest.fixture(scope="module")
def cluster(model_dir: Path, logs: Path, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[dict[str, Any]]:
    explain = tmp_path_factory.mktemp("explain") / "explain.jsonl"
    proc = mooncake("local-vllm-events", logs, "conductor", "start", "--local", "2,1",
                    "--engine", "vllm", "--model", MODEL, "--block-size", str(BS),
                    "--kv-blocks", str(KV_BLOCKS), "--policy", "kvcache-centric",
                    "--explain", str(explain), "--port", "0", "--secret", SECRET)
    try:
        proc.wait_until(lambda: event(proc, "serving") is not None, START_S)
        url = event(proc, "serving")["url"]
        engines = lambda: [s for s in streams(url) if s["type"] == "vLLM"]  # noqa: E731
        assert poll(lambda: len(engines()) == 2 or None, 60), streams(url)
        served = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        yield {"url": url, "explain": explain, "proc": proc, "model": served}
    finally:
        proc.stop()


def streams(url: str) -> list[dict[str, Any]]:
    ans = jsonhttp.call(url + "/indexer/streams", timeout=10, method="GET", auth=AUTH)
    assert ans.status == 200, ans.body
    return list(ans.body["streams"])


def prefill_urls(url: str) -> dict[str, str]:
    snap = httpx.get(url + "/v1/instances", timeout=10).json()
    return {i["name"]: i["url"] for i in snap["instances"] if i["role"] == "prefill"}


def held(cluster: dict[str, Any], ids: list[int]) -> dict[str, int]:
    """Per prefill worker: the leading tokens of `ids` its events say it holds."""
    ans = jsonhttp.call(cluster["url"] + "/query", {"model": cluster["model"], "block_size": BS,
                                                    "token_ids": ids})
    assert ans.status == 200, ans.body
    return {name: m["longest_matched"] for name, m in ans.body.get("default", {}).items()}


def decisions(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ask(c: OpenAI, model: str, ids: list[int]) -> Any:
    return c.completions.create(model=model, prompt=ids, max_tokens=4, temperature=0)


def tokenize(text: str) -> list[int]:
    from transformers import AutoTokenizer

    from mooncake_vllm.model_dir import model_folder

    return list(AutoTokenizer.from_pretrained(str(model_folder(MODEL))).encode(text))


def test_routes_on_events_and_forgets_evicted_blocks(cluster: dict[str, Any]) -> None:
    url, explain = cluster["url"], cluster["explain"]
    c = client(url)
    first = tokenize(long_prompt(7))
    whole = len(first) // BS * BS  # the blocks a later prompt can share
    ask(c, cluster["model"], first)
    [d1] = decisions(explain)
    owner = d1["prefill"]["instance"]
    other = next(n for n in prefill_urls(url) if n != owner)
    # its events arrive: the index says it holds every whole block, the other worker none
    assert poll(lambda: held(cluster, first).get(owner) == whole or None, 30), held(cluster, first)
    assert held(cluster, first).get(other, 0) == 0

    second = first[:whole] + tokenize(" Now list every city you read about.")
    answer = ask(c, cluster["model"], second)
    d2 = decisions(explain)[-1]
    assert d2["prefill"]["instance"] == owner
    assert (d2["kv_events"][owner], d2["kv_events"][other]) == (whole // BS, 0)
    assert d2["prefill"]["local_blocks"] == whole // BS
    assert answer.usage.prompt_tokens_details.cached_tokens == whole  # vLLM's own count

    # fill the owner's small KV cache with other prompts until vLLM evicts the prefix
    purl = prefill_urls(url)[owner]

    def evicted() -> bool | None:
        if held(cluster, first).get(owner, 0) == 0:
            return True
        seed = uuid.uuid4().int % 10**6
        ans = jsonhttp.call(purl + "/v1/prefill", {"request_id": f"fill-{seed}",
                                                   "prompt": long_prompt(1000 + seed)},
                            timeout=120, auth=AUTH)
        assert ans.status == 200, ans.body
        return None

    assert poll(evicted, 300, interval=0.1), held(cluster, first)
    kinds = {s["instance_id"]: s["counts"] for s in streams(url)}
    assert kinds[owner].get("removed", 0) > 0

    # vLLM's store connector saved the prefix: the store's own events (the --local master's)
    # name those objects by vLLM's block hashes, which the owner's events tied to the tokens
    answer = ask(c, cluster["model"], second)
    d3 = decisions(explain)[-1]
    assert d3["kv_events"] == {owner: 0, other: 0, STORE: whole // BS}
    chosen = d3["prefill"]
    assert (chosen["local_blocks"], chosen["fetch_blocks"], chosen["fetch_from"]) == \
        (0, whole // BS, STORE)
    assert answer.usage.prompt_tokens_details.cached_tokens == whole  # loaded from the store
