"""Upstream `mooncake.store`'s multi-buffer and tensor-buffer forms as a specification, held
against our compat module and (where the wheel is installed) upstream's own class, as
test_compat_upstream_api.py does: batch_put_from_multi_buffers / batch_get_into_multi_buffers,
put_from_with_metadata, get_tensor_into / put_tensor_from and their batch, upsert and
tensor-parallel forms, the pub forms with a config, the sessions, safetensors, the copy and
move tasks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.conftest import wait_for
from tests.integration.test_compat_upstream_api import Side, make, side  # noqa: F401  (the fixtures)

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(120)


def registered(s: Any, data: bytes | int) -> np.ndarray:
    """A registered buffer holding `data` (or that many zero bytes)."""
    buf = np.zeros(data, np.uint8) if isinstance(data, int) else \
        np.frombuffer(data, np.uint8).copy()
    assert s.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    return buf


def test_multi_buffers_gather_and_scatter(make: Callable[..., Any]) -> None:  # noqa: F811
    s = make()
    src = registered(s, b"AAAAAAAABBBBCCCCCCCCCCCC")
    p = src.ctypes.data
    assert s.batch_put_from_multi_buffers(["m1", "m2"], [[p, p + 8], [p + 12]],
                                          [[8, 4], [12]]) == [0, 0]
    assert (s.get("m1"), s.get("m2")) == (b"AAAAAAAABBBB", b"C" * 12)
    assert s.batch_put_from_multi_buffers(["m1"], [[p + 12]], [[4]]) == [0]  # exists: kept
    assert s.get("m1") == b"AAAAAAAABBBB"
    assert s.batch_put_from_multi_buffers(["m3", "m4"], [[p], []], [[4, 4], []]) == [-600, -600]

    out = registered(s, 32)
    q = out.ctypes.data
    assert s.batch_get_into_multi_buffers(["m1", "m2", "nope"], [[q, q + 16], [q + 4], [q + 28]],
                                          [[4, 8], [12], [4]]) == [12, 12, -704]
    assert out[:4].tobytes() == b"AAAA" and out[16:24].tobytes() == b"AAAABBBB"
    assert out[4:16].tobytes() == b"C" * 12
    out[:] = 0
    assert s.batch_get_into_multi_buffers(["m1", "m1", "m1"], [[q, q + 16], [q, q + 16], [q]],
                                          [[4, 4], [8, 8], [4, 4]]) == [-600, -800, -600]
    assert not out.any()  # a refused read writes nothing


def test_put_from_with_metadata_puts_the_metadata_first(make: Callable[..., Any]) -> None:  # noqa: F811
    s = make()
    src = registered(s, b"DATAmeta")
    p = src.ctypes.data
    assert s.put_from_with_metadata("wm", p, p + 4, 4, 4) == 0
    assert s.get("wm") == b"metaDATA"
    assert s.put_from_with_metadata("wm", p, p + 4, 2, 2) == 0 and s.get("wm") == b"metaDATA"


def test_tensors_into_and_from_caller_buffers(make: Callable[..., Any]) -> None:  # noqa: F811
    s = make()
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert s.put_tensor("t", t) == 0
    n = s.get_size("t")
    assert n == 304 + 48
    buf = registered(s, n + 64)
    got = s.get_tensor_into("t", buf.ctypes.data, buf.nbytes)
    assert torch.equal(got, t)
    buf[304:308] = 0xFF  # the tensor is a view of the caller's buffer
    assert torch.isnan(got[0, 0])
    assert s.get_tensor_into("t", buf.ctypes.data, 100) is None
    assert s.get_tensor_into("nope", buf.ctypes.data, buf.nbytes) is None
    got = s.batch_get_tensor_into(["t", "nope"], [buf.ctypes.data] * 2, [buf.nbytes] * 2)
    assert torch.equal(got[0], t) and got[1] is None

    assert s.put_tensor_from("t2", buf.ctypes.data, n) == 0 and torch.equal(s.get_tensor("t2"), t)
    assert s.put_tensor_from("t3", buf.ctypes.data, n + 64) == -600  # not exactly one tensor
    assert s.put_tensor_from("t3", buf.ctypes.data, 100) == -600
    junk = registered(s, b"x" * 400)
    assert s.batch_put_tensor_from(["t3", "t4"], [junk.ctypes.data, buf.ctypes.data],
                                   [400, n]) == [-600, -600]  # one is no tensor: none is put
    assert s.is_exist("t4") == 0
    assert s.batch_put_tensor_from(["t4"], [buf.ctypes.data], [n]) == [0]
    assert s.put_tensor_from("t2", junk.ctypes.data, 400) == -600

    other = torch.ones(2, 2, dtype=torch.bfloat16)
    assert s.put_tensor("o", other) == 0
    obuf = registered(s, s.get_size("o"))
    assert s.get_tensor_into("o", obuf.ctypes.data, obuf.nbytes) is not None
    assert s.upsert_tensor_from("t2", obuf.ctypes.data, obuf.nbytes) == 0
    assert torch.equal(s.get_tensor("t2"), other)
    assert s.batch_upsert_tensor_from(["t4"], [obuf.ctypes.data], [obuf.nbytes]) == [0]
    assert torch.equal(s.get_tensor("t4"), other)


def test_tensor_parallel_buffer_and_pub_forms(side: Side, make: Callable[..., Any]) -> None:  # noqa: F811
    s = make()
    big = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    rc = side.m.ReplicateConfig()
    assert s.pub_tensor_with_tp("bt", big, rc, tp_rank=0, tp_size=2, split_dim=1) == 0
    assert torch.equal(s.get_tensor("bt_tp_1"), big[:, 3:])
    buf = registered(s, 1024)
    got = s.get_tensor_with_tp_into("bt", buf.ctypes.data, 1024, tp_rank=1, tp_size=2,
                                    split_dim=1)
    assert torch.equal(got, big[:, 3:])
    assert s.batch_pub_tensor_with_tp(["bt2"], [big], rc, tp_size=2) == [0]
    got = s.batch_get_tensor_with_tp_into(["bt2", "nope"], [buf.ctypes.data, buf.ctypes.data + 512],
                                          [512, 512], tp_rank=0, tp_size=2)
    assert torch.equal(got[0], big[:2]) and got[1] is None

    assert s.put_tensor("full", big) == 0
    full = registered(s, s.get_size("full"))
    assert s.get_into("full", full.ctypes.data, full.nbytes) == full.nbytes
    assert s.put_tensor_with_tp_from("ft", full.ctypes.data, full.nbytes, tp_rank=0, tp_size=2,
                                     split_dim=0) == 0
    assert torch.equal(s.get_tensor("ft_tp_0"), big[:2])
    assert torch.equal(s.get_tensor("ft_tp_1"), big[2:])
    assert s.batch_put_tensor_with_tp_from(["ft2"], [full.ctypes.data], [full.nbytes],
                                           tp_size=3, split_dim=1) == [0]
    assert torch.equal(s.get_tensor("ft2_tp_2"), big[:, 4:])

    assert s.batch_upsert_pub_tensor(["bt_tp_1"], [big], rc) == [0]
    assert torch.equal(s.get_tensor("bt_tp_1"), big)


def test_put_and_get_sessions_with_ranges(make: Callable[..., Any]) -> None:  # noqa: F811
    s = make()
    src = registered(s, b"AAAABBBBCCCC")
    p = src.ctypes.data
    assert s.batch_put_session_start(["s1", "s2"], [8, 4]) == [0, 0]
    assert s.is_exist("s1") == 0 and s.get("s1") == b""  # not readable before its end
    assert s.batch_put_from_multi_buffer_ranges(["s1", "s2", "nope"],
                                                [[p, p + 4], [p + 8], [p]],
                                                [[4, 4], [4], [4]],
                                                [[4, 0], [0], [0]]) == [8, 4, -600]
    assert s.batch_put_from_multi_buffer_ranges(["s2"], [[p]], [[4]], [[2]]) == [-600]  # past
    assert s.batch_put_session_end(["s1", "s2", "nope"]) == [0, 0, -600]
    assert (s.get("s1"), s.get("s2")) == (b"BBBBAAAA", b"CCCC")
    assert s.batch_put_session_start(["s1"], [8]) == [-705]
    assert s.batch_put_session_start(["s3"], [8]) == [0]
    assert s.batch_put_session_revoke(["s3"]) == [0] and s.is_exist("s3") == 0

    out = registered(s, 16)
    q = out.ctypes.data
    assert s.batch_get_session_start(["s1", "nope"]) == [0, -704]
    assert s.batch_get_into_multi_buffer_ranges(["s1"], [[q, q + 8]], [[2, 2]],
                                                [[0, 6]]) == [4]
    assert out[:2].tobytes() == b"BB" and out[8:10].tobytes() == b"AA"
    assert s.batch_get_into_multi_buffer_ranges(["s2"], [[q]], [[2]], [[1]]) == [-600]
    assert s.batch_get_into_multi_buffer_ranges(["s1"], [[q]], [[4]], [[6]]) == [-600]
    assert s.batch_get_session_end(["s1", "nope"]) == 0


def test_safetensors_save_and_load(make: Callable[..., Any], tmp_path: Any) -> None:  # noqa: F811
    from safetensors.torch import load_file, save_file

    s = make()
    t = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    assert s.put_tensor("tk", t) == 0
    assert s.save_tensor_to_safetensor("tk", str(tmp_path / "a.safetensors")) == 0
    assert torch.equal(load_file(str(tmp_path / "a.safetensors"))["tk"], t)
    assert s.save_tensor_to_safetensor("nope", str(tmp_path / "b.safetensors")) == -1100

    save_file({"w1": torch.ones(2, 2), "w2": torch.zeros(3)}, str(tmp_path / "c.safetensors"))
    got = s.load_tensor_from_safetensor(key="w2", file_name=str(tmp_path / "c.safetensors"))
    assert torch.equal(got, torch.zeros(3)) and torch.equal(s.get_tensor("w2"), torch.zeros(3))
    got = s.load_tensor_from_safetensor(key="zz", file_name=str(tmp_path / "c.safetensors"))
    assert torch.equal(got, torch.ones(2, 2)) and torch.equal(s.get_tensor("zz"), got)
    name = str(tmp_path / "c.safetensors")
    assert s.load_tensor_from_safetensor(file_name=name) is not None and s.is_exist(name) == 1
    assert s.load_tensor_from_safetensor(key="w1", file_name=str(tmp_path / "none")) is None


def _settled(s: Any, task_id: Any) -> Any:
    """The task's answer once it is no longer pending (upstream's master queues it)."""
    deadline = time.monotonic() + 20
    while True:
        resp, rc = s.query_task(task_id)
        assert rc == 0 and resp is not None
        if resp.status.name not in ("PENDING", "PROCESSING") or time.monotonic() > deadline:
            return resp
        time.sleep(0.1)  # sleep: poll


def test_copy_and_move_tasks(side: Side, make: Callable[..., Any]) -> None:  # noqa: F811
    a, b = make(), make()
    ha, hb = a.get_hostname(), b.get_hostname()
    rc = side.m.ReplicateConfig()
    rc.preferred_segment = ha
    assert a.put("k", b"x" * 1000, rc) == 0
    assert len(a.get_replica_desc("k")) == 1

    task_id, code = a.create_copy_task("k", [hb])
    assert code == 0 and task_id != (0, 0)
    resp = _settled(a, task_id)
    assert (resp.status.name, resp.type.name, resp.id) == ("SUCCESS", "REPLICA_COPY", task_id)
    assert resp.last_updated_at_ms_epoch >= resp.created_at_ms_epoch > 0
    assert len(a.get_replica_desc("k")) == 2
    assert b.get("k") == b"x" * 1000

    task_id, code = a.create_move_task("k", hb, ha)
    assert code == 0
    assert _settled(a, task_id).status.name == "SUCCESS"
    wait_for(lambda: len(a.get_replica_desc("k")) == 1, 10)
    assert a.get("k") == b"x" * 1000

    assert a.create_copy_task("nope", [hb]) == ((0, 0), -704)
    assert a.create_copy_task("k", ["nohost:1"]) == ((0, 0), -600)
    assert a.query_task((1, 2)) == (None, -1400)
