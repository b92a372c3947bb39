"""`--kv-wire int8` across processes: `mooncake prefill` and `mooncake decode` serving
smollm2-135m through a real store master stream and store int8 blocks (half the bytes, int8
keys), and their greedy tokens equal the uncompressed path's (our engine in this process on the
float32 KV; it equals transformers', see test_smollm_exact.py), also with 90% of a prompt's
blocks read back from the store as int8; a decode worker on the native wire is refused, not
fed int8 bytes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import pytest

from mooncake_cli.engine.kv_int8 import wire_bytes
from mooncake_cli.http.jsonhttp import call
from mooncake_cli.kvkeys import parse_key
from tests.helpers.prom import value
from tests.helpers.smollm import NAME, NEW, RAW, long_text
from tests.helpers.store_procs import Proc, start_master
from tests.helpers.worker_procs import WorkerProc, complete

pytestmark = pytest.mark.timeout(600)
BLOCK = 16
SAMPLING = {"max_tokens": NEW, "temperature": 0, "ignore_eos": True}
NINETY = "ninety"  # kept out of the store until the 90%-cached test primes it
SHAPE = (30, 2, 3, BLOCK, 64)  # smollm2-135m: layers, K/V, kv heads, block, head dim
NATIVE_BYTES = 30 * 2 * 3 * BLOCK * 64 * 4  # float32, the workers' dtype


@dataclass(frozen=True)
class Case:
    name: str
    ids: tuple[int, ...]
    want: tuple[int, ...]  # the uncompressed path's greedy tokens


@lru_cache(maxsize=1)
def cases() -> tuple[Case, ...]:
    """The raw prompts of test_smollm_exact.py and two of about 1.1k tokens of real text."""
    from mooncake_cli.engine import KVCache, ModelRunner, SamplingParams, load_model

    model = load_model(NAME)
    tok = model.tokenizer
    text = long_text(1100, tok)
    prompts = {f"raw{i}": tok.encode(t) for i, t in enumerate(RAW)}
    prompts["long"] = tok.encode(text)
    prompts[NINETY] = tok.encode("List the commands named here:\n" + text)
    runner = ModelRunner(model, KVCache(model.namespace(BLOCK), 256), chunk_size=512)
    params = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True)
    return tuple(Case(name, tuple(ids), tuple(s.output_ids)) for (name, ids), s in
                 zip(prompts.items(), runner.generate(list(prompts.values()), params),
                     strict=True))


@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[WorkerProc, WorkerProc, WorkerProc]]:
    """An int8 prefill (with the store), an int8 decode and a native decode."""
    master: Proc = start_master(0)
    common = ["--model", NAME, "--block-size", str(BLOCK)]
    prefill = WorkerProc("prefill", *common, "--kv-wire", "int8", "--store",
                         str(master.ready["address"]), "--segment-size", "256MiB",
                         "--chunk-size", "256", "--name", "p-int8")
    decode = WorkerProc("decode", *common, "--kv-wire", "int8", "--kv-blocks", "256",
                        "--name", "d-int8")
    native = WorkerProc("decode", *common, "--kv-blocks", "64", "--name", "d-native")
    try:
        yield prefill.ready(240), decode.ready(240), native.ready(240)
    finally:
        for w in (prefill, decode, native):
            w.stop()
        master.stop()


def _sent(url: str) -> float:
    text = call(url + "/metrics").body["text"]
    return value(text, "mooncake_worker_kv_bytes_sent_total", role="prefill")


def test_int8_stream_gives_the_uncompressed_greedy_tokens(
        workers: tuple[WorkerProc, WorkerProc, WorkerProc]) -> None:
    prefill, decode, _ = workers
    assert prefill.info["kv_wire"] == decode.info["kv_wire"] == "int8"
    blocks, stored = 0, []
    before = _sent(prefill.url)
    for c in cases():
        if c.name == NINETY:
            continue
        answer, got, final = complete(prefill.url, decode.url, f"int8-{c.name}", list(c.ids),
                                      SAMPLING)
        assert tuple(got) == c.want, c.name
        assert final["finish_reason"] == "length"
        stored += answer["stored_keys"]
        blocks += -(-len(c.ids) // BLOCK)
    assert stored and {parse_key(k)[1] for k in stored} == {"int8"}
    # every block of every prompt crossed as an int8 object, about half of a bfloat16 one
    assert _sent(prefill.url) - before == blocks * wire_bytes(SHAPE)
    assert wire_bytes(SHAPE) < NATIVE_BYTES // 3
    load = call(decode.url + "/v1/load").body
    assert load["free_blocks"] == load["total_blocks"], "finished requests free blocks"


def test_ninety_percent_from_the_int8_store(
        workers: tuple[WorkerProc, WorkerProc, WorkerProc]) -> None:
    prefill, decode, _ = workers
    [c] = [c for c in cases() if c.name == NINETY]
    ids = list(c.ids)
    full = len(ids) // BLOCK
    cached = -(-9 * full // 10)
    prime, _, _ = complete(prefill.url, None, "int8-prime", ids[:cached * BLOCK], SAMPLING)
    assert len(prime["stored_keys"]) == cached
    answer, got, _ = complete(prefill.url, decode.url, "int8-ninety", ids, SAMPLING)
    assert answer["cached_tokens"] == cached * BLOCK
    assert tuple(got) == c.want
    text = call(prefill.url + "/metrics").body["text"]
    assert value(text, "mooncake_worker_kv_bytes_loaded_total", role="prefill") == \
        cached * wire_bytes(SHAPE)


def test_a_native_decode_worker_is_refused(
        workers: tuple[WorkerProc, WorkerProc, WorkerProc]) -> None:
    prefill, _, native = workers
    ids = list(cases()[0].ids)
    answer = call(prefill.url + "/v1/prefill", {"request_id": "int8-to-native",
                                               "token_ids": ids, "sampling": SAMPLING,
                                               "decode": native.url}, timeout=120)
    assert answer.status == 409, answer.body
    assert "takes KV as native, this prefill sends int8 (--kv-wire)" in str(answer.body)
    load = call(native.url + "/v1/load").body
    assert load["free_blocks"] == load["total_blocks"], "its reservation was given back"
