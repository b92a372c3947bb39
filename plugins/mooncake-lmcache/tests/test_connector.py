"""LMCache engines (LMCacheEngineBuilder, a CPU KV connector, post_init) storing KV through the
plugin into a real store master and node in other processes, and reading it back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.errors import ObjectHasLease

from mooncake_lmcache import harness as h
from mooncake_lmcache.procs import StoreProcs
from tests.conftest import wait_for

LAYOUT = h.KVLayout(num_layers=4, num_heads=2, head_size=64, chunk_size=256)
N = 600  # two full chunks and a partial one
ENGINE_PROC = Path(__file__).with_name("engine_proc.py")
def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def chunk_keys(inspector: StoreClient) -> list[str]:
    return sorted(inspector.list("lmcache/"))


def new_keys(inspector: StoreClient, before: set[str], n: int) -> list[str]:
    """The keys added since `before` once there are `n` of them; [] until then."""
    new = sorted(set(chunk_keys(inspector)) - before)
    return new if len(new) == n else []


def stored(store: StoreProcs, inspector: StoreClient, kv: torch.Tensor, toks: torch.Tensor,
           **settings: object) -> list[str]:
    """Store `kv` for `toks` through a writer engine, wait for its three chunks to land in the
    store, close the writer; the chunks' keys."""
    before = set(chunk_keys(inspector))
    writer = h.build("writer", LAYOUT, h.mooncake_config(store.master, **settings))
    try:
        writer.store(toks, kvcaches=kv)
        new = wait_for(lambda: new_keys(inspector, before, 3), 20,
                       what="the writer's 3 chunks")
    finally:
        h.destroy(writer)
    return new


def test_a_second_engine_retrieves_the_kv_bit_for_bit(store: StoreProcs,
                                                      inspector: StoreClient) -> None:
    toks, kv = h.tokens(N, 1), LAYOUT.random(N, 1)
    keys = stored(store, inspector, kv, toks)
    sizes = sorted(inspector.size(k) for k in keys)
    tb = LAYOUT.token_bytes()
    assert sizes == [(N - 512) * tb, 256 * tb, 256 * tb]  # raw KV bytes, nothing added

    reader = h.build("reader", LAYOUT, h.mooncake_config(store.master))
    try:
        assert reader.lookup(toks) == N
        out = LAYOUT.empty(N)
        mask = reader.retrieve(toks, kvcaches=out)
        assert bool(mask.all())
        assert same_bits(out, kv)
        conn = reader.storage_manager.storage_backends["RemoteBackend-mooncake"].connection
        io = conn._connector.link.client.io  # LMCache's CPU buffer is registered with the
        assert conn._connector.direct and io._stage._region is None  # engine: nothing staged
        other = h.tokens(N, 2)  # a prompt nobody stored
        assert reader.lookup(other) == 0
    finally:
        h.destroy(reader)


def test_replicas_keep_the_kv_when_the_writers_segment_leaves(store: StoreProcs,
                                                              inspector: StoreClient) -> None:
    toks, kv = h.tokens(N, 3), LAYOUT.random(N, 3)
    keys = stored(store, inspector, kv, toks, segment_size="64MiB", replica_num=2)
    # the writer's own segment held the first replica of each chunk, the node the second;
    # the writer has gone, and with it its segment and those replicas
    for key in keys:
        assert len(inspector.describe(key).replicas) == 1
    node_segment = {r.segment for k in keys for r in inspector.describe(k).replicas}
    assert len(node_segment) == 1

    reader = h.build("reader", LAYOUT, h.mooncake_config(store.master))
    try:
        out = LAYOUT.empty(N)
        assert bool(reader.retrieve(toks, kvcaches=out).all())
        assert same_bits(out, kv)
    finally:
        h.destroy(reader)


def test_a_lookup_leases_the_chunks_it_found(store: StoreProcs, inspector: StoreClient) -> None:
    toks_a, kv_a = h.tokens(N, 4), LAYOUT.random(N, 4)
    toks_b, kv_b = h.tokens(N, 5), LAYOUT.random(N, 5)
    keys_a = stored(store, inspector, kv_a, toks_a)
    keys_b = stored(store, inspector, kv_b, toks_b)
    for key in keys_a:  # stored but never looked up: removable
        inspector.remove(key)
    reader = h.build("reader", LAYOUT, h.mooncake_config(store.master))
    try:
        assert reader.lookup(toks_a) == 0
        assert reader.lookup(toks_b) == N
        for key in keys_b:  # the master's lease (30 s here) protects what the lookup found
            with pytest.raises(ObjectHasLease):
                inspector.remove(key)
        out = LAYOUT.empty(N)
        assert bool(reader.retrieve(toks_b, kvcaches=out).all())
        assert same_bits(out, kv_b)
    finally:
        h.destroy(reader)


def test_the_store_going_away_is_a_clean_miss(store: StoreProcs, inspector: StoreClient) -> None:
    toks, kv = h.tokens(N, 6), LAYOUT.random(N, 6)
    stored(store, inspector, kv, toks)
    reader = h.build("reader", LAYOUT, h.mooncake_config(store.master, timeout=1,
                                                         retry_interval=30))
    try:
        assert reader.lookup(toks) == N
        store.kill()
        began = time.monotonic()
        assert reader.lookup(toks) == 0  # one master timeout, then misses without asking
        out = LAYOUT.empty(N)
        mask = reader.retrieve(toks, kvcaches=out)
        assert not bool(mask.any())
        assert not bool(out.view(torch.int16).any())  # nothing half-written into the KV cache
        reader.store(h.tokens(N, 7), kvcaches=LAYOUT.random(N, 7))  # stores are dropped quietly
        assert reader.lookup(h.tokens(N, 7)) == N  # ... and the local CPU tier still serves
        assert time.monotonic() - began < 10
    finally:
        h.destroy(reader)


def engine_proc(master: str, mode: str, seed: int) -> dict[str, object]:
    # without vLLM, LMCache hashes chunks with Python's hash(): processes sharing chunks need
    # one PYTHONHASHSEED
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    r = subprocess.run([sys.executable, str(ENGINE_PROC), "--master", master, mode,
                        "--tokens", str(N), "--seed", str(seed)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def test_an_engine_in_another_process_reads_what_one_stored(store: StoreProcs) -> None:
    assert engine_proc(store.master, "store", 8) == {"stored": True}
    # the writer's process has exited; the chunks live on the store node
    assert engine_proc(store.master, "retrieve", 8) == {"hit": N, "retrieved": N, "same": True}
