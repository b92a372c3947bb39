"""vLLM's MooncakeConnector, unchanged, on each side's `mooncake.engine`: a prefill instance
(kv_producer) and a decode instance (kv_consumer), the test as their proxy (what vLLM's
Mooncake P/D proxy sends). The decode instance reports each prompt as an external prefix-cache
hit and answers exactly what a plain vLLM instance answers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prompts import short_prompts
from sides import Side, upstream_missing
from vllm_server import HITS, MAX_TOKENS, VllmServer

from tests.conftest import free_port

# (side, mooncake_protocol): "auto" is ours only (upstream 0.3.13 has no such protocol)
CASES = [("ours", "tcp"), ("ours", "auto"), ("upstream", "tcp")]


class PD:
    def __init__(self, prefill: VllmServer, decode: VllmServer, engine_id: str,
                 bootstrap_port: int) -> None:
        self.prefill, self.decode = prefill, decode
        self.engine_id, self.bootstrap = engine_id, f"http://127.0.0.1:{bootstrap_port}"

    def generate(self, prompt: str) -> tuple[str, dict[str, Any]]:
        """The proxy's two requests: prefill on P (max_tokens 1, P keeps the blocks for D),
        then decode on D pulling them from P."""
        transfer_id = f"xfer-{uuid.uuid4().hex}"
        self.prefill.complete(prompt, max_tokens=1, kv_transfer_params={
            "do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id})
        out = self.decode.complete(prompt, max_tokens=MAX_TOKENS, kv_transfer_params={
            "do_remote_decode": False, "do_remote_prefill": True, "transfer_id": transfer_id,
            "remote_engine_id": self.engine_id, "remote_bootstrap_addr": self.bootstrap})
        return out["choices"][0]["text"], out["usage"]


def _server(side: Side, model: Path, role: str, protocol: str, engine_id: str,
            bootstrap_port: int) -> VllmServer:
    config = {"kv_connector": "MooncakeConnector", "kv_role": role, "engine_id": engine_id,
              "kv_connector_extra_config": {"mooncake_protocol": protocol}}
    env = {**side.env(), "VLLM_MOONCAKE_BOOTSTRAP_PORT": str(bootstrap_port)}
    what = f"{role}-{protocol}"
    return VllmServer(f"{side.name} {what}", model, env, side.logs / f"vllm-{what}.log", config)


@pytest.fixture(scope="module", params=CASES, ids=[f"{s}-{p}" for s, p in CASES])
def pd(request: pytest.FixtureRequest, model_dir: Path, logs: Path) -> Iterator[PD]:
    name, protocol = request.param
    if name == "upstream" and (why := upstream_missing()):
        pytest.skip(why)
    folder = logs / f"pd-{name}-{protocol}"
    folder.mkdir()
    side = Side(name, folder)
    engine_id = f"prefill-{name}-{protocol}"
    port = free_port()
    prefill = _server(side, model_dir, "kv_producer", protocol, engine_id, port)
    decode = _server(side, model_dir, "kv_consumer", protocol, f"decode-{name}-{protocol}",
                     free_port())
    try:  # both start at once; each is waited for
        yield PD(prefill.wait_ready(), decode.wait_ready(), engine_id, port)
    finally:
        decode.stop()
        prefill.stop()
        side.close()


def test_decode_pulls_the_prompt_and_answers_as_plain_vllm(plain_texts: dict[str, str],
                                                           pd: PD) -> None:
    for i, prompt in enumerate(short_prompts()):
        before = pd.decode.metric(HITS)
        text, usage = pd.generate(prompt)
        hits = pd.decode.hits_since(before)
        tokens = int(usage["prompt_tokens"])
        print(f"prompt {i}: D got {hits:.0f} of {tokens} prompt tokens from P")
        assert hits >= tokens - 1, f"prompt {i}: only {hits} of {tokens} tokens from P"
        assert text == plain_texts[prompt], f"prompt {i}"
