"""`mooncake bench store`: the command end to end on tiny settings (a real master child process,
a real client, a real holding client in remote mode), its --json fields, and a verification that
fails on wrong bytes. Structure only, never timing thresholds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mooncake_cli.bench import store_tensors, store_upstream
from mooncake_cli.bench.stats import summarize
from mooncake_cli.bench.store import BenchStoreConfig, StoreBench, merged
from mooncake_cli.bench.store_workload import Row, run_row, verify
from mooncake_cli.config import TransferConfig
from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.registry import Registry
from tests.helpers.procs import child_env

TINY = ["--sizes", "4KiB,64KiB", "--batches", "1,3", "--duration", "0.2", "--iterations", "6",
        "--segment-size", "16MiB", "--tensor-sizes", "64KiB"]
TENSOR_ROWS = [(op, 65536, b) for b in (1, 4) for op in ("put_tensor", "get_tensor")]
FIELDS = ("name", "transport", "op", "block_size", "batch_size", "bytes", "transfers",
          "seconds", "gbps", "transfers_per_s", "p50_us", "p99_us", "verified", "note")


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mooncake_cli", "--json", "bench", "store",
                           *args], capture_output=True, text=True, timeout=timeout,
                          env=child_env())


def reports(*args: str) -> list[dict]:  # type: ignore[type-arg]
    p = bench(*TINY, *args)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["duration"] == 0.2
    return out["reports"]  # type: ignore[no-any-return]


def check(rep: dict, name: str = "ours") -> dict:  # type: ignore[type-arg]
    res = next(r for r in rep["results"] if r["name"] == name)
    assert set(FIELDS) <= set(res)
    row = rep["row"]
    assert (res["op"], res["block_size"], res["batch_size"]) == (row["op"], row["size"],
                                                                 row["batch"])
    assert res["verified"] is True and res["note"] == ""
    assert 0 < res["transfers"] <= 6 * row["batch"]
    assert res["transfers_per_s"] > 0 and 0 < res["p50_us"] <= res["p99_us"]
    if row["op"] == "exists":
        assert res["bytes"] == 0
    else:
        assert res["bytes"] == res["transfers"] * row["size"] and res["gbps"] > 0
    return res  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode,via", [("local", "local"), ("remote", "shm")])
def test_every_row_runs_and_verifies(mode: str, via: str) -> None:
    reps = reports("--mode", mode)
    rows = [(r["row"]["op"], r["row"]["size"], r["row"]["batch"]) for r in reps]
    want = [(op, s, b) for s in (4096, 65536) for b in (1, 3) for op in ("put", "get")]
    assert rows == want + [("exists", 4096, 1)] + TENSOR_ROWS
    for rep in reps:
        assert check(rep)["transport"] == via
        assert rep["ratio"] is None and rep["skipped"] == {}


def test_human_table_and_bad_options() -> None:
    p = subprocess.run([sys.executable, "-m", "mooncake_cli", "bench", "store", "--sizes",
                        "4KiB", "--batches", "2", "--iterations", "3", "--duration", "0.1",
                        "--segment-size", "4MiB", "--tensor-sizes", ""], capture_output=True,
                       text=True,
                       timeout=240, env=child_env(COLUMNS="200"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "bench store: local mode" in p.stdout and "exists 4KiB" in p.stdout
    assert "tensor" not in p.stdout
    for args, words in ((["--sizes", "4KiB,huge"], "--sizes"), (["--batches", "0"], "--batches"),
                        (["--mode", "nowhere"], "--mode"),
                        (["--sizes", "4MiB", "--segment-size", "1MiB"], "--segment-size"),
                        (["--tensor-sizes", "big"], "--tensor-sizes"),
                        (["--rounds", "0"], "--rounds"),
                        (["--tensor-sizes", "1MiB", "--segment-size", "8MiB"], "--segment-size")):
        p = bench(*args, timeout=60)
        assert p.returncode == 2, (args, p.stderr)
        assert words in p.stderr and "Traceback" not in p.stderr


def test_turns_merge_into_one_row() -> None:
    a = summarize("ours", "local", "put", 4096, 2, 1, 8192, 2, 0.5, [0.1, 0.3], True)
    b = summarize("ours", "local", "put", 4096, 2, 1, 24576, 6, 1.5, [0.2, 0.2, 0.5], True)
    m = merged([a, b])
    assert (m.bytes, m.transfers, m.seconds) == (32768, 8, 2.0)
    assert m.gbps == round(32768 / 2.0 / 1e9, 4) and m.transfers_per_s == 4.0
    assert m.p50_us == round((a.p50_us + b.p50_us) / 2, 2)  # the median of two turns
    assert m.verified is True and merged([a]) is a
    bad = summarize("ours", "local", "put", 4096, 2, 1, 8192, 2, 0.5, [0.1], False, "differ")
    assert merged([a, bad, b]).verified is False and merged([a, bad, b]).note == "differ"


class FlippingStore:
    """Our real store, except that `get` hands back its bytes with the first one flipped:
    what a broken data path would do."""

    def __init__(self, store: object) -> None:
        self._s = store

    def __getattr__(self, name: str) -> object:
        return getattr(self._s, name)

    def get(self, key: str) -> bytes:
        data = bytearray(self._s.get(key))  # type: ignore[attr-defined]
        data[0] ^= 0xFF
        return bytes(data)


def test_verification_fails_on_wrong_bytes() -> None:
    cfg = BenchStoreConfig(sizes="4KiB", batches="2", duration=0.1, iterations=3,
                           segment_size=4 << 20, tensor_sizes="")
    with StoreBench(cfg, TransferConfig(), Registry.from_env()) as b:
        b.store.put("v/k", b"A" * 100)
        assert verify(b.store, ["v/k"], [b"A" * 100]) == ""
        assert "differ" in verify(b.store, ["v/k"], [b"B" * 100])
        assert "99 were put" in verify(b.store, ["v/k"], [b"A" * 99])
        b.store.clear()
        for op in ("put", "get"):
            res = run_row(FlippingStore(b.store), Row(op, 4096, 2), 0.1, 3, "ours", "local")
            assert res.verified is False and "differ" in res.note
        ok = run_row(b.store, Row("get", 4096, 2), 0.1, 3, "ours", "local")
        assert ok.verified is True
        b.store = FlippingStore(b.store)  # type: ignore[assignment]
        with pytest.raises(MooncakeError, match="verification failed"):
            b.run(Row("put", 4096, 1))
        torch = pytest.importorskip("torch")
        t = torch.arange(8, dtype=torch.bfloat16)
        b.store.put_tensor("v/t", t)
        assert store_tensors.verify(b.store, ["v/t"], [t]) == ""
        assert "differs" in store_tensors.verify(b.store, ["v/t"], [t + 1])
        assert "differs" in store_tensors.verify(b.store, ["v/none"], [t])


@pytest.mark.skipif(not store_upstream.available()[0],
                    reason="upstream's store (mooncake-transfer-engine-non-cuda) is missing: "
                           "pip install 'mooncake-cli[upstream]'")
def test_compare_upstream() -> None:
    reps = reports("--sizes", "4KiB", "--batches", "2", "--compare-upstream")
    assert len(reps) == 3 + len(TENSOR_ROWS)
    for rep in reps:
        check(rep)
        up = check(rep, "upstream")
        assert up["transport"] == "local"
        assert rep["ratio"] > 0 and rep["p50_ratio"] > 0 and rep["skipped"] == {}
