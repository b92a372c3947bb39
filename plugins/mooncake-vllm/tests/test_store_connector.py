"""vLLM's MooncakeStoreConnector, unchanged, on each side's store: a fresh instance B gets at
least 80% of a long prompt's tokens from the store (vLLM's own counter
`vllm:external_prefix_cache_hits_total`) and answers A's greedy text; with a store node holding
the blocks they outlive A, and once that node is killed with -9 a fresh instance recomputes the
same text with no error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prompts import long_prompt
from sides import Side
from vllm_server import HITS, VllmServer

MiB = 1 << 20
KV_CONFIG = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
             # a block the store lost (its node killed) is recomputed, never an error
             "kv_load_failure_policy": "recompute"}


def store_config(side: Side, master: str, standalone: bool) -> Path:
    """The MOONCAKE_CONFIG_PATH file of vLLM's store client (vllm/distributed/
    mooncake_store.py): embedded mode contributes 256 MiB per instance; standalone-store
    contributes nothing (the store node holds the blocks)."""
    config: dict[str, Any] = {
        "metadata_server": "P2PHANDSHAKE", "master_server_address": master,
        "protocol": "tcp", "device_name": "", "local_buffer_size": 64 * MiB,
        "mode": "standalone-store" if standalone else "embedded",
        "global_segment_size": 0 if standalone else 256 * MiB,
    }
    path = side.logs / f"mooncake-{'standalone' if standalone else 'embedded'}.json"
    path.write_text(json.dumps(config))
    return path


def start(side: Side, model: Path, config: Path, what: str) -> VllmServer:
    env = {**side.env(), "MOONCAKE_CONFIG_PATH": str(config)}
    return VllmServer(f"{side.name} {what}", model, env, side.logs / f"vllm-{what}.log",
                      KV_CONFIG)


def serve(server: VllmServer, prompt: str) -> tuple[str, int, float]:
    """(greedy text, prompt tokens, external prefix-cache hits of this request)."""
    before = server.metric(HITS)
    out = server.complete(prompt)
    return out["choices"][0]["text"], int(out["usage"]["prompt_tokens"]), server.hits_since(before)


def test_embedded_second_instance_reads_the_store(side: Side, model_dir: Path) -> None:
    master = side.start_master()
    config = store_config(side, master, standalone=False)
    prompt = long_prompt(1)
    a = start(side, model_dir, config, "embedded-A")
    b: VllmServer | None = None
    try:
        text_a, tokens, _ = serve(a.wait_ready(), prompt)  # A keeps its segment: stays up
        b = start(side, model_dir, config, "embedded-B").wait_ready()
        text_b, tokens_b, hits = serve(b, prompt)
        print(f"{side.name} embedded: B got {hits:.0f} of {tokens_b} prompt tokens from the store")
        assert tokens_b == tokens >= 1000
        assert hits >= 0.8 * tokens
        assert text_b == text_a
    finally:
        for server in (b, a):
            if server is not None:
                server.stop()


def test_store_node_outlives_a_then_dies(side: Side, model_dir: Path) -> None:
    master = side.start_master()
    node = side.start_node(master, 512 * MiB)
    config = store_config(side, master, standalone=True)
    prompt = long_prompt(2)
    a = start(side, model_dir, config, "standalone-A")
    try:
        text_a, tokens, _ = serve(a.wait_ready(), prompt)
    finally:
        a.stop()  # its blocks stay on the node
    b = start(side, model_dir, config, "standalone-B")
    try:
        text_b, _, hits = serve(b.wait_ready(), prompt)
    finally:
        b.stop()
    print(f"{side.name} standalone: B got {hits:.0f} of {tokens} prompt tokens after A exited")
    assert hits >= 0.8 * tokens
    assert text_b == text_a

    node.kill9()  # the only copy of the blocks goes; the master is told nothing
    c = start(side, model_dir, config, "standalone-C")
    try:
        text_c, _, hits_c = serve(c.wait_ready(), prompt)
        assert c.proc.alive()
    finally:
        c.stop()
    print(f"{side.name} node killed: C got {hits_c:.0f} prompt tokens from the store, recomputed")
    assert text_c == text_a
