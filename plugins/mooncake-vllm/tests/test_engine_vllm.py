"""`--engine vllm`: the roles run vLLM's async engine in their own process, vLLM's
MooncakeConnector moving each prompt's KV from prefill to decode and MooncakeStoreConnector
saving it to our store, all on our transfer engine.

`mooncake conductor start --local 1,1 --engine vllm` (one process: the conductor, a store
master, a prefill and a decode worker on vLLM), and one more decode worker on vLLM started on
its own, registering with that conductor: greedy answers through the conductor, asked with the
official `openai` client, streaming and not, are exactly a plain vLLM instance's; a repeated
prompt reports its cached blocks; the roles are in /v1/instances and serve the native workers'
/metrics figures; a worker whose engine core is killed leaves the conductor. A vLLM engine that
cannot start is one line with vLLM's cause.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from procs import Proc
from prompts import long_prompt, short_prompts
from sides import base_env
from vllm_server import MAX_TOKENS, REQUEST_S, START_S

MODEL = "smollm2-135m"
SECRET = "engine-vllm-test"
BS = 128  # vLLM's CPU block size (a multiple of 32), as the plain instance's
ROLE = ["--model", MODEL, "--block-size", str(BS), "--kv-blocks", "80"]


def env() -> dict[str, str]:
    """vllm_server.py's settings: one unpinned compute thread per engine, 1 GiB of KV."""
    return {**base_env(), "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}


def mooncake(what: str, logs: Path, *args: str) -> Proc:
    argv = [sys.executable, "-m", "mooncake_cli", "--json", *args]
    return Proc(what, argv, env(), logs / f"{what}.log")


def events(proc: Proc) -> list[dict[str, Any]]:
    """The JSON events the process printed so far (vLLM's own lines go to its log file)."""
    out = []
    for line in proc.log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line still being written
    return out


def event(proc: Proc, name: str) -> dict[str, Any] | None:
    return next((e for e in events(proc) if e.get("event") == name), None)


@pytest.fixture(scope="module")
def cluster(model_dir: Path, logs: Path) -> Iterator[dict[str, Any]]:
    """The --local cluster: its conductor URL and store master (`model_dir`: the named model's
    folder is exported before, where the roles find it)."""
    proc = mooncake("local-vllm", logs, "conductor", "start", "--local", "1,1", "--engine",
                    "vllm", *ROLE, "--port", "0", "--secret", SECRET)
    try:
        proc.wait_until(lambda: event(proc, "serving") is not None, START_S)
        master = next(e["what"].split(" at ")[1] for e in events(proc)
                      if e.get("what", "").startswith("store master at "))
        yield {"url": event(proc, "serving")["url"], "master": master, "proc": proc}
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def registered(cluster: dict[str, Any], logs: Path) -> Iterator[dict[str, Any]]:
    """A decode worker on vLLM started on its own, registered with the cluster's conductor."""
    proc = mooncake("decode-registered", logs, "decode", "--engine", "vllm", *ROLE,
                    "--store", cluster["master"], "--conductor", cluster["url"],
                    "--secret", SECRET, "--name", "decode-r", "--heartbeat", "0.5")
    try:
        proc.wait_until(lambda: event(proc, "ready") is not None, START_S)
        proc.wait_until(lambda: "decode-r" in alive(cluster["url"]), 60)
        yield {**(event(proc, "ready") or {}), "proc": proc}
    finally:
        proc.stop()


def alive(url: str) -> dict[str, dict[str, Any]]:
    snap = httpx.get(url + "/v1/instances", timeout=10).json()
    return {i["name"]: i for i in snap["instances"] if i["alive"]}


def client(url: str) -> OpenAI:
    return OpenAI(base_url=url + "/v1", api_key="none", timeout=REQUEST_S, max_retries=0)


def metric(text: str, name: str) -> float:
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def test_a_vllm_engine_that_cannot_start_is_one_line(model_dir: Path, logs: Path) -> None:
    """vLLM's CPU attention takes block sizes that are multiples of 32: the cause is vLLM's
    own error, read from its log, which the line names."""
    proc = mooncake("decode-bs16", logs, "decode", "--engine", "vllm", "--model", MODEL,
                    "--block-size", "16", "--kv-blocks", "1024")
    proc.wait_until(lambda: not proc.alive(), START_S)
    assert proc.proc.returncode == 1
    [line] = proc.log.read_text().splitlines()
    m = re.fullmatch(r"error: the vLLM engine of decode@127\.0\.0\.1:\d+ did not start: "
                     r"ValueError: No common block size for 16 \(CPU_ATTN: "
                     r"\[MultipleOf\(32\)\]\)\. \(vLLM's log: (\S+)\)", line)
    assert m is not None, line
    assert "Traceback" in Path(m.group(1)).read_text()  # the whole story is in vLLM's log


def test_greedy_answers_are_plain_vllms(plain_texts: dict[str, str], cluster: dict[str, Any],
                                        registered: dict[str, Any]) -> None:
    api = client(cluster["url"])
    for i, prompt in enumerate(short_prompts()):
        whole = api.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS,
                                       temperature=0)
        assert whole.choices[0].text == plain_texts[prompt], f"prompt {i}"
        chunks = api.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS,
                                        temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in chunks) == plain_texts[prompt], f"prompt {i}"


def test_a_repeated_prompt_reports_its_cached_blocks(cluster: dict[str, Any]) -> None:
    api = client(cluster["url"])
    prompt = long_prompt(7, facts=20)
    first = api.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
    again = api.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
    assert first.usage is not None and again.usage is not None
    tokens = again.usage.prompt_tokens
    assert tokens % BS and tokens > BS
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    assert again.usage.prompt_tokens_details.cached_tokens == tokens // BS * BS  # type: ignore
    assert again.choices[0].text == first.choices[0].text


def test_the_roles_are_registered_and_metered(cluster: dict[str, Any],
                                              registered: dict[str, Any]) -> None:
    client(cluster["url"]).completions.create(model=MODEL, prompt=short_prompts()[0],
                                              max_tokens=MAX_TOKENS, temperature=0)
    live = alive(cluster["url"])
    assert {n: (i["role"], i["static"]) for n, i in live.items()} == {
        "prefill-0": ("prefill", True), "decode-0": ("decode", True),
        "decode-r": ("decode", False)}
    assert registered["engine"] == "vllm" and registered["kv_blocks"] == 80
    for proc in (cluster["proc"], registered["proc"]):  # vLLM's own lines are in its log
        lines = proc.log.read_text().splitlines()
        assert lines and all(line.startswith("{") for line in lines), proc.tail()
    assert all(i["load"]["total_blocks"] == 80 for i in live.values())
    scraped = {n: httpx.get(i["url"] + "/metrics", timeout=10).text for n, i in live.items()}
    for name, text in scraped.items():
        for figure in ("prefix_hit_ratio", "kv_used_bytes", "kv_capacity_bytes",
                       "prefix_evictions_total", "kv_bytes_sent_total"):
            assert f"mooncake_worker_{figure}" in text, (name, figure)
    p = scraped["prefill-0"]
    assert metric(p, "mooncake_worker_prompt_tokens_total") > 0
    assert metric(p, "mooncake_worker_kv_bytes_sent_total") > 0  # to the decode workers
    assert metric(p, "mooncake_worker_kv_bytes_stored_total") > 0  # into the store
    decodes = [scraped["decode-0"], scraped["decode-r"]]
    assert sum(metric(t, "mooncake_worker_kv_bytes_loaded_total") for t in decodes) > 0
    assert sum(metric(t, "mooncake_worker_generated_tokens_total") for t in decodes) > 0
    conductor = httpx.get(cluster["url"] + "/metrics", timeout=10).text
    assert metric(conductor, "mooncake_conductor_requests_total") > 0


def test_a_worker_whose_vllm_dies_leaves_the_conductor(plain_texts: dict[str, str],
                                                       cluster: dict[str, Any],
                                                       registered: dict[str, Any]) -> None:
    """kill -9 of the registered decode worker's vLLM engine core: the worker answers /health
    with 503 and deregisters; the conductor goes on with the other decode worker. (Last: the
    registered worker is of no use after.)"""
    import psutil

    worker = psutil.Process(registered["proc"].pid)
    [core] = [p for p in worker.children(recursive=True)
              if "EngineCore" in " ".join(p.cmdline())]
    core.kill()
    registered["proc"].wait_until(lambda: "decode-r" not in alive(cluster["url"]), 60)
    health = httpx.get(registered["url"] + "/health", timeout=10)
    assert health.status_code == 503 and health.json()["status"] == "dead"
    assert "decode-r" not in {i["name"] for i in httpx.get(
        cluster["url"] + "/v1/instances", timeout=10).json()["instances"]}
    prompt = short_prompts()[1]
    answer = client(cluster["url"]).completions.create(model=MODEL, prompt=prompt,
                                                       max_tokens=MAX_TOKENS, temperature=0)
    assert answer.choices[0].text == plain_texts[prompt]
