"""A real vLLM OpenAI server (`python -m vllm.entrypoints.openai.api_server`) in its own process
group: started with a side's environment, ready when /health answers, asked for greedy
completions, read through /metrics."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import httpx
from procs import Proc, poll

from tests.conftest import free_port

START_S = 900.0  # one start is ~35 s on an idle 2-core host, minutes when it is shared
REQUEST_S = 300.0
MAX_TOKENS = 12  # greedy tokens compared between instances
# the tokens of a request vLLM got from its KV connector (the store, or a prefill instance)
HITS = "vllm:external_prefix_cache_hits_total"
# float32: this CPU (AVX2, no AVX512-BF16) runs bf16 through slow paths
ARGS = ["--max-model-len", "2048", "--enforce-eager", "--max-num-seqs", "4", "--dtype", "float32",
        "--seed", "0"]


class VllmServer:
    def __init__(self, what: str, model: Path, env: dict[str, str], log: Path,
                 kv_transfer_config: dict[str, Any] | None = None,
                 args: list[str] | None = None) -> None:
        """`args` come after ARGS (the last of a repeated option wins)."""
        self.port = free_port()
        self.model = str(model)
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                self.model, "--host", "127.0.0.1", "--port", str(self.port), *ARGS,
                *(args or [])]
        if kv_transfer_config is not None:
            argv += ["--kv-transfer-config", json.dumps(kv_transfer_config)]
        # one unpinned compute thread each: pinned OpenMP threads of two instances on the same
        # cores (vLLM's "auto" binding) spin against each other and stall both for minutes
        env = {**env, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
        self.proc = Proc(f"vLLM {what}", argv, env, log)
        self.url = f"http://127.0.0.1:{self.port}"
        self.http = httpx.Client(base_url=self.url, timeout=REQUEST_S)

    def _healthy(self) -> bool:
        try:
            return self.http.get("/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self) -> VllmServer:
        self.proc.wait_until(self._healthy, START_S)
        return self

    def complete(self, prompt: str, max_tokens: int = MAX_TOKENS,
                 kv_transfer_params: dict[str, Any] | None = None) -> dict[str, Any]:
        """A greedy completion's JSON (HTTP errors raise, with vLLM's answer and log)."""
        body: dict[str, Any] = {"model": self.model, "prompt": prompt,
                                "max_tokens": max_tokens, "temperature": 0}
        if kv_transfer_params is not None:
            body["kv_transfer_params"] = kv_transfer_params
        r = self.http.post("/v1/completions", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"{self.proc.what}: HTTP {r.status_code} {r.text[:500]}\n"
                               f"{self.proc.tail()}")
        return dict(r.json())

    def metric(self, name: str) -> float:
        """The sum of every sample of `name` (e.g. vllm:external_prefix_cache_hits_total)."""
        text = self.http.get("/metrics").text
        pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
        return sum(float(v) for v in pattern.findall(text))

    def hits_since(self, before: float, name: str = HITS) -> float:
        """How far counter `name` rose past `before`: the counter follows the response by a
        moment (it is updated with the request's stats), so it is polled for up to 10 s."""
        return poll(lambda: (self.metric(name) - before) or None, 10) or 0.0

    def log_has(self, needle: str) -> bool:
        try:
            return needle in self.proc.log.read_text(errors="replace")
        except OSError:
            return False

    def stop(self) -> None:
        self.http.close()
        self.proc.stop()
