"""The master's `--root_fs_dir` (upstream's persistence root) through the upstream API: every
put is also written under ROOT/CLUSTER_ID, an object memory has evicted is still found, sized
and read from there, a put of it keeps it, an upsert replaces it, remove_all takes the files.
Held against our compat module and, where upstream's wheel is installed, upstream's own class
and master in the same session; then what only ours promises (a damaged file is refused, the
files outlive a killed master and a departed client)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import REPO, free_port, wait_for
from tests.helpers.procs import child_env
from tests.helpers.store_procs import Proc

os.environ.setdefault("GLOG_minloglevel", "2")
pytestmark = pytest.mark.timeout(120)
MiB = 1 << 20
CLUSTER = "c1"
LEASE_S = 0.5  # a read's lease (upstream grants one to get_replica_desc too)


def our_master(root: Path, port: int = 0) -> Proc:
    return Proc([sys.executable, "-m", "mooncake_cli", "--json", "store", "master", "--port",
                 str(port or free_port()), "--root_fs_dir", str(root), "--cluster_id", CLUSTER,
                 "--lease-ttl", str(LEASE_S)])


class Side:
    def __init__(self, name: str, module: Any, master: str, root: Path) -> None:
        self.name, self.m, self.master, self.root = name, module, master, root
        self.stores: list[Any] = []

    def store(self, segment: int = 16 * MiB) -> Any:
        s = self.m.MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", segment, 16 * MiB, "tcp", "",
                       self.master) == 0
        self.stores.append(s)
        return s

    def files(self) -> list[Path]:
        return [p for p in (self.root / CLUSTER).rglob("*") if p.is_file()]


def sides(kind: str, root: Path) -> Iterator[Side]:
    """One side with its master persisting under `root`; its stores closed at the end."""
    if kind == "ours":
        from mooncake_cli.compat import store as ours

        m = our_master(root)
        assert m.ready["fs_dir"] == str(root / CLUSTER)
        sd = Side("ours", ours, str(m.ready["address"]), root)
        yield sd
        for s in reversed(sd.stores):
            s.close()
        m.stop()
        return
    from mooncake_cli.bench import store_upstream

    ok, why = store_upstream.available()
    if not ok:
        pytest.skip(why)
    import mooncake.store as theirs

    um = store_upstream.UpstreamMaster(f"--root_fs_dir={root}", f"--cluster_id={CLUSTER}",
                                       f"--default_kv_lease_ttl={int(LEASE_S * 1000)}")
    sd = Side("upstream", theirs, um.address, root)
    yield sd
    for s in reversed(sd.stores):
        s.close()
    um.close()


@pytest.fixture(params=["ours", "upstream"])
def side(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Side]:
    yield from sides(request.param, tmp_path)


@pytest.mark.parametrize("kind", ["ours", "upstream"])
def test_setup_fails_where_the_root_is_not_mounted(kind: str, tmp_path: Path) -> None:
    for sd in sides(kind, tmp_path / "not-mounted"):
        s = sd.m.MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "",
                       sd.master) == -1
        assert not (tmp_path / "not-mounted").exists()


def evict(s: Any, key: str) -> None:
    """Put 40 MiB of fresh values through the 16 MiB segment until `key` has left memory
    (its lease first run out); again while a put finds memory full."""
    for n in range(5):
        time.sleep(LEASE_S + 0.2)  # sleep: behaviour - the fills' leases run out in real time
        for i in range(40):
            assert room(lambda k=f"fill{n}-{i}": s.put(k, os.urandom(MiB))) == 0
        if kinds(s, key) == ["disk"]:
            return
    raise AssertionError(f"{key} is still in memory: {kinds(s, key)}")


def room(call: Any) -> int:
    """`call()`'s code, called again while memory is full (-200: eviction has not caught up
    after a fill; upstream's more often than ours)."""
    deadline = time.monotonic() + 10
    while (rc := call()) == -200 and time.monotonic() < deadline:
        time.sleep(0.05)  # sleep: poll
    return int(rc)


def kinds(s: Any, key: str) -> list[str]:
    return ["memory" if d.is_memory_replica() else "disk" if d.is_disk_replica() else "other"
            for d in s.get_replica_desc(key)]


def test_puts_are_persisted_and_evicted_objects_are_read_back(side: Side) -> None:
    s = side.store()
    value = np.random.default_rng(1).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    assert s.put("a/b cold", value) == 0
    wait_for(lambda: kinds(s, "a/b cold") == ["memory", "disk"], 10)
    disk = s.get_replica_desc("a/b cold")[1].get_disk_descriptor()
    assert disk.object_size == len(value)
    assert Path(disk.file_path).is_relative_to(side.root / CLUSTER)
    wait_for(lambda: Path(disk.file_path).is_file(), 10)

    evict(s, "a/b cold")
    assert s.is_exist("a/b cold") == 1 and s.batch_is_exist(["a/b cold", "nope"]) == [1, 0]
    assert s.get_size("a/b cold") == len(value)
    assert s.get("a/b cold") == value
    buf = np.zeros(len(value), np.uint8)
    assert s.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    assert s.get_into("a/b cold", buf.ctypes.data, buf.nbytes) == len(value)
    assert buf.tobytes() == value
    assert s.unregister_buffer(buf.ctypes.data) == 0

    assert s.put("a/b cold", b"other") == 0  # it exists: unchanged
    assert s.get("a/b cold") == value
    assert room(lambda: s.upsert("a/b cold", b"replaced")) == 0
    assert s.get("a/b cold") == b"replaced"


def test_remove_all_removes_the_files(side: Side) -> None:
    s = side.store()
    for i in range(5):
        assert s.put(f"k{i}", bytes([i]) * 10_000) == 0
    wait_for(lambda: len(side.files()) == 5, 10)
    # Upstream's master skips an object whose disk replica it has not yet been told is
    # complete; the files are written first, so a second call can find it. Each object is
    # counted once across the calls.
    removed = [s.remove_all()]
    wait_for(lambda: sum(removed) >= 5 or removed.append(s.remove_all()), 10)
    assert sum(removed) == 5 and s.remove_all() == 0
    wait_for(lambda: side.files() == [], 10)
    assert s.is_exist("k0") == 0 and s.get("k0") == b""


def test_tensors_are_persisted_too(side: Side) -> None:
    torch = pytest.importorskip("torch")
    s = side.store()
    t = torch.arange(100_000, dtype=torch.float32).reshape(100, 1000)
    assert s.put_tensor("t", t) == 0
    evict(s, "t")
    back = s.get_tensor("t")
    assert back is not None and torch.equal(back, t)


# -- ours only ------------------------------------------------------------------------------------
@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "dfs").mkdir()
    return tmp_path / "dfs"


def _ours(master: str) -> Any:
    from mooncake_cli.compat.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", master) == 0
    return s


def test_files_outlive_a_killed_master_and_a_departed_client(root: Path) -> None:
    port = free_port()
    m = our_master(root, port)
    a = _ours(str(m.ready["address"]))
    assert a.put_batch(["x", "y"], [b"x" * 5000, b"y" * 7000]) == 0
    a._conn.client.files.flush()
    m.proc.kill()  # kill -9: the master's index is gone
    m.proc.wait()
    a.close()
    m2 = our_master(root, port)
    try:
        b = _ours(str(m2.ready["address"]))
        assert b.get("x") == b"x" * 5000 and b.get_size("y") == 7000
        assert sorted(b._conn.client.list()) == ["x", "y"]
        assert b.remove_by_regex("^x$") == 1 and b.is_exist("x") == 0
        assert b.remove("y") == 0 and b.remove("y") == -704
        b.close()
    finally:
        m2.stop()


def test_a_damaged_file_is_not_served_and_files_are_private(root: Path) -> None:
    m = our_master(root)
    try:
        s = _ours(str(m.ready["address"]))
        assert s.put("k", b"v" * 4096) == 0
        s._conn.client.files.flush()
        path = Path(s._conn.client.files.path("k"))
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the values are the user's alone
        assert {stat.S_IMODE(d.stat().st_mode) for d in (path.parent, path.parent.parent,
                                                         root / CLUSTER)} == {0o700}
        evict(s, "k")
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(raw)
        assert s.get("k") == b""
        path.write_bytes(raw[:-100])  # short
        assert s.get("k") == b"" and s.get_size("k") == 4096  # its header is intact
        s.close()
    finally:
        m.stop()


def test_a_master_flag_that_is_not_a_path_is_refused(tmp_path: Path) -> None:
    for flags, refused in ((["--root_fs_dir", "relative/dir"], "root_fs_dir 'relative/dir'"),
                           (["--root-fs-dir", str(tmp_path), "--cluster-id", "../up"],
                            "cluster_id '../up'")):
        p = subprocess.run([sys.executable, "-m", "mooncake_cli", "store", "master", "--port",
                            "0", *flags], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert refused in p.stderr, p.stderr  # the setting at fault, with its value


def test_a_root_the_client_cannot_write_fails_setup(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    m = our_master(blocker)
    try:
        from mooncake_cli.compat.store import MooncakeDistributedStore

        s = MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "",
                       str(m.ready["address"])) == -1
        assert s.put("k", b"v") != 0
    finally:
        m.stop()


def test_writes_still_queued_at_exit_are_written(root: Path) -> None:
    m = our_master(root)
    try:
        code = ("import sys\nfrom mooncake_cli.compat.store import MooncakeDistributedStore\n"
                "s = MooncakeDistributedStore()\n"
                "assert s.setup('127.0.0.1', 'P2PHANDSHAKE', 64 << 20, 64 << 20, 'tcp', '', "
                "sys.argv[1]) == 0\n"
                "assert s.put_batch([f'k{i}' for i in range(8)], [bytes(4 << 20)] * 8) == 0\n")
        subprocess.run([sys.executable, "-c", code, str(m.ready["address"])], check=True,
                       timeout=60)  # no close(): the interpreter's exit writes the queue
        s = _ours(str(m.ready["address"]))
        assert all(s._conn.client.files.size(f"k{i}") == 4 << 20 for i in range(8))
        s.close()
    finally:
        m.stop()


def test_doctor_says_whether_this_host_has_the_masters_root(tmp_path: Path) -> None:
    for root, want in ((tmp_path, "ok"), (tmp_path / "not-mounted", "fail")):
        m = our_master(root)
        try:
            done = subprocess.run([sys.executable, "-m", "mooncake_cli", "--json", "doctor",
                                   "--group", "master", "--master", str(m.ready["address"])],
                                  capture_output=True, text=True, cwd=REPO, env=child_env(),
                                  timeout=120)
        finally:
            m.stop()
        checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
        assert checks["root_fs_dir"]["status"] == want, done.stdout
        assert checks["root_fs_dir"]["data"]["fs_dir"] == str(root / CLUSTER)
        named = "master/root_fs_dir" in done.stderr  # (master/segments fails too: no client)
        assert named is (want == "fail") and done.returncode == 1
        if want == "fail":
            assert "mount the shared file system" in checks["root_fs_dir"]["fix"]


def test_bad_arguments_are_codes_with_the_file_tier_on(root: Path) -> None:
    m = our_master(root)
    try:
        s = _ours(str(m.ready["address"]))
        assert s.put(None, b"x") < 0 and s.put(b"k", b"x") < 0  # type: ignore[arg-type]
        assert s.put_batch(["k"], []) == -600 and s.put_parts(1.5, b"x") < 0  # type: ignore[arg-type]
        assert s.get_tensor_into("k", 1 << 70, 1) is None
        assert s.put_tensor_from("k", 1, 1 << 70) == -600
        assert s.is_exist("k") == 0 and s.put("k", b"x") == 0 and s.get("k") == b"x"
        s.close()
    finally:
        m.stop()


def test_a_reader_falls_back_to_the_file_when_the_holder_was_killed(root: Path) -> None:
    m = Proc([sys.executable, "-m", "mooncake_cli", "--json", "store", "master", "--port",
              str(free_port()), "--root_fs_dir", str(root), "--client-ttl", "60"])
    code = ("import sys, time\nfrom mooncake_cli.compat.store import MooncakeDistributedStore\n"
            "s = MooncakeDistributedStore()\n"
            "assert s.setup('127.0.0.1', 'P2PHANDSHAKE', 16 << 20, 16 << 20, 'tcp', '', "
            "sys.argv[1]) == 0\n"
            "assert s.put('held', b'h' * 100_000) == 0\n"
            "s._conn.client.files.flush()\nprint('ready', flush=True)\ntime.sleep(60)\n")
    writer = subprocess.Popen([sys.executable, "-c", code, str(m.ready["address"])],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        s = _ours(str(m.ready["address"]))
        writer.kill()  # kill -9: its segment, the only replica, is gone; the master not told
        writer.wait()
        assert s.get("a-key-nobody-put") == b""
        assert s.get("held") == b"h" * 100_000  # memory's read fails: the file answers
        s.close()
    finally:
        if writer.poll() is None:
            writer.kill()
        m.stop()
