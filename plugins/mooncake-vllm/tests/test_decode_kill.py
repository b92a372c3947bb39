"""kill -9 of a decode worker on vLLM while answers stream from it.

`mooncake conductor start --local 1,1 --engine vllm` and a second decode worker on vLLM started
on its own, registered with that conductor. Greedy streams run through the conductor with the
official `openai` client; the second decode worker's whole process group (the role and its
vLLM engine core) is killed with SIGKILL while some of them stream from it. The conductor
marks it gone, every stream ends (none hangs), and those that were on it are moved to the
other decode worker (the conductor's migration: the answer so far is prefilled again and
decoding goes on there), ending with plain vLLM's text.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from procs import poll
from prompts import short_prompts
from test_engine_vllm import ROLE, alive, client, event, metric, mooncake
from vllm_server import START_S

SECRET = "decode-kill-test"
TOKENS = 160  # long enough that a kill lands mid-answer


@pytest.fixture(scope="module")
def cluster(model_dir: Path, logs: Path, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[dict[str, Any]]:
    explain = tmp_path_factory.mktemp("explain") / "explain.jsonl"
    proc = mooncake("local-vllm-kill", logs, "conductor", "start", "--local", "1,1",
                    "--engine", "vllm", *ROLE, "--explain", str(explain), "--port", "0",
                    "--secret", SECRET)
    try:
        proc.wait_until(lambda: event(proc, "serving") is not None, START_S)
        url = event(proc, "serving")["url"]
        master = next(e["what"].split(" at ")[1] for e in _events(proc)
                      if e.get("what", "").startswith("store master at "))
        victim = mooncake("decode-victim", logs, "decode", "--engine", "vllm", *ROLE,
                          "--store", master, "--conductor", url, "--secret", SECRET,
                          "--name", "decode-v", "--heartbeat", "0.5")
        try:
            victim.wait_until(lambda: "decode-v" in alive(url), START_S)
            served = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
            yield {"url": url, "explain": explain, "victim": victim, "model": served}
        finally:
            victim.stop()
    finally:
        proc.stop()


def _events(proc: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in proc.log.read_text(errors="replace").splitlines()
            if line.startswith("{") and line.endswith("}")]


def on_victim(explain: Path) -> int:
    return sum(1 for line in explain.read_text().splitlines()
               if line.strip() and json.loads(line).get("decode") == "decode-v")


def test_streams_on_a_killed_decode_worker_are_moved(cluster: dict[str, Any],
                                                     plain_texts: dict[str, str]) -> None:
    url, c = cluster["url"], client(cluster["url"])
    prompts = short_prompts() * 2  # 10 streams over the two decode workers
    texts: dict[int, str] = {}
    errors: dict[int, str] = {}
    tokens = [0] * len(prompts)

    def stream(i: int) -> None:
        try:
            out = []
            for chunk in c.completions.create(model=cluster["model"], prompt=prompts[i],
                                              max_tokens=TOKENS, temperature=0, stream=True):
                if chunk.choices:
                    out.append(chunk.choices[0].text)
                    tokens[i] += 1
            texts[i] = "".join(out)
        except Exception as e:  # noqa: BLE001 (the test reports what the client saw)
            errors[i] = f"{type(e).__name__}: {e}"

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    # kill once streams are under way on the victim
    assert poll(lambda: (on_victim(cluster["explain"]) >= 2 and sum(tokens) >= 20) or None,
                START_S), "no stream reached the victim"
    cluster["victim"].kill9()
    for t in threads:
        t.join(600)
    assert not any(t.is_alive() for t in threads), "a stream hangs"
    assert poll(lambda: "decode-v" not in alive(url) or None, 60)
    assert errors == {}
    moved = metric(httpx.get(url + "/metrics", timeout=10).text,
                   "mooncake_conductor_migrations_total")
    assert moved >= 1
    plain = {p: plain_texts[p] for p in prompts}
    for i, p in enumerate(prompts):
        # plain vLLM's answer of max_tokens MAX_TOKENS is a prefix of this longer one
        assert texts[i].startswith(plain[p]), (i, texts[i][:200], plain[p][:200])
