"""The `ssd` tier plugin (data file, advisory lock, manifest log) and the `dram` tier's huge
pages: real files in tmp_path, real mmaps; huge pages for real when the machine has some
reserved, and otherwise the fallback and its advice, for real."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from mooncake_backends.dram import DramTier
from mooncake_backends.ssd import DATA, SsdTier
from mooncake_backends.ssd.manifest import LOG, Entry, Manifest

from mooncake_cli.interfaces import ConfigError

MiB = 1 << 20


# -- the manifest and the data file ---------------------------------------------------------------
def test_manifest_replays_puts_dels_and_skips_torn_lines(tmp_path: Path) -> None:
    m = Manifest(str(tmp_path))
    m.add(Entry("a", 0, 100, "x"))
    m.add(Entry("b", 128, 100, "y"))
    m.add(Entry("c", 64, 100, "z"))  # overlaps both: they are gone
    m.add(Entry("d", 256, 10, "w"))
    m.remove(256)
    m.add(Entry("c", 512, 100, "z2"))  # the key moved
    m.close()
    with open(tmp_path / LOG, "ab") as f:
        f.write(b'0000 {"op":"put"')  # torn append
    again = Manifest(str(tmp_path))
    assert again.entries() == [Entry("c", 512, 100, "z2")]
    assert len(again.problems) == 1 and "torn" in again.problems[0]
    again.close()
    assert len((tmp_path / LOG).read_bytes().splitlines()) == 1  # compacted


def test_data_file_size_lock_and_bad_sizes(tmp_path: Path) -> None:
    tier = SsdTier()
    buf = tier.open(str(tmp_path), 1 * MiB)
    assert (tmp_path / DATA).stat().st_size == MiB and len(buf.view) == MiB
    buf.view[10:13] = b"abc"
    buf.flush(10, 3)
    with pytest.raises(ConfigError, match="in use by another process"):
        tier.open(str(tmp_path), MiB)
    buf.close()
    with pytest.raises(ConfigError, match="ask for 1048576 bytes or more"):
        tier.open(str(tmp_path), 4096)
    buf = tier.open(str(tmp_path), 0)
    assert bytes(buf.view[10:13]) == b"abc" and buf.size == MiB
    buf.close()
    with pytest.raises(ConfigError, match="give a size"):
        tier.open(str(tmp_path / "empty"), 0)
    scratch = tier.allocate(8192)
    where = scratch.directory
    scratch.close()
    assert not os.path.exists(where)


# -- huge pages ----------------------------------------------------------------------------------
def free_hugepages() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("HugePages_Free"))


def test_hugepages_or_a_clear_way_to_get_them(caplog: pytest.LogCaptureFixture) -> None:
    tier = DramTier()
    if free_hugepages() >= 2:
        buf = tier.allocate(3 * MiB, hugepages=True, strict=True)
        assert buf.hugepages and len(buf.view) == 3 * MiB
        buf.close()
        return
    with pytest.raises(ConfigError, match=r"sudo sysctl -w vm\.nr_hugepages=\d+"):
        tier.allocate(3 * MiB, hugepages=True, strict=True)
    with caplog.at_level(logging.WARNING, logger="mooncake.tiers"):
        buf = tier.allocate(3 * MiB, hugepages=True)
    assert not buf.hugepages and "using normal pages" in caplog.text
    assert "vm.nr_hugepages" in caplog.text
    buf.view[-1] = 7
    buf.close()
