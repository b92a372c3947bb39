"""`ssd` tier: a preallocated data file in a directory, mapped into memory, plus a manifest.

    buf = SsdTier().open("/mnt/nvme/mooncake", 8 << 30)  # data file + manifest.log in there
    engine.register(buf.view)  # the file's bytes, readable and writable like memory

The data file (`data.bin`) is reserved on disk up front (posix_fallocate: a full disk fails now,
not on a later write) and mapped shared, so writes reach the file; `flush` forces a range to
disk. The manifest (see manifest.py) says which object lives where, so a restarted node finds
its objects again. A directory is used by one process at a time (an advisory lock).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import shutil
import tempfile

from mooncake_cli.interfaces import ConfigError

from .manifest import Entry, Manifest

DATA = "data.bin"
LOCK = "lock"

__all__ = ["DATA", "Entry", "Manifest", "SsdBuffer", "SsdTier"]


class SsdBuffer:
    """`size` bytes of the data file in `directory` (0: the size the file already has)."""

    def __init__(self, directory: str, size: int, scratch: bool = False) -> None:
        if size < 0:
            raise ConfigError(f"ssd size must be >= 0, got {size}")
        self.directory = os.path.abspath(directory)
        self.shm: str | None = None  # a file, not POSIX shm: peers reach it over TCP
        self._scratch = scratch
        try:
            os.makedirs(self.directory, exist_ok=True)
            self._lock = os.open(os.path.join(self.directory, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise ConfigError(f"cannot use ssd directory {self.directory}: {e}") from e
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock)
            raise ConfigError(f"ssd directory {self.directory} is in use by another "
                              "process") from None
        try:
            self._mm, self.size = self._map(size)
            self.manifest = Manifest(self.directory)
        except BaseException:
            os.close(self._lock)
            raise
        self.view = memoryview(self._mm)[:self.size]

    def _map(self, size: int) -> tuple[mmap.mmap, int]:
        path = os.path.join(self.directory, DATA)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            have = os.fstat(fd).st_size
            if size == 0 and have == 0:
                raise ConfigError(f"ssd directory {self.directory} holds no data file: "
                                  "give a size")
            if 0 < size < have:
                raise ConfigError(f"{path} is {have} bytes, more than the {size} asked for: "
                                  f"ask for {have} bytes or more, or use another directory")
            size = size or have
            if size > have:
                try:
                    os.posix_fallocate(fd, have, size - have)
                except OSError as e:
                    os.ftruncate(fd, have)
                    raise ConfigError(f"cannot reserve {size} bytes for {path}: {e}") from e
            return mmap.mmap(fd, size, mmap.MAP_SHARED), size
        finally:
            os.close(fd)

    def flush(self, offset: int, size: int) -> None:
        """Force bytes [offset, offset+size) of the data file to disk."""
        start = offset - offset % mmap.PAGESIZE
        end = min(self.size, offset + size)
        self._mm.flush(start, end - start)

    def record(self, key: str, offset: int, size: int, checksum: str) -> None:
        """Note durably (in the manifest) that `key`'s bytes are at [offset, offset+size)."""
        self.manifest.add(Entry(key, offset, size, checksum))

    def close(self) -> None:
        self.manifest.close()
        self.view.release()
        try:
            self._mm.close()
        except BufferError:  # a caller still holds a view; the mapping goes with it
            pass
        os.close(self._lock)
        if self._scratch:
            shutil.rmtree(self.directory, ignore_errors=True)


class SsdTier:
    name = "ssd"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def open(self, directory: str, size: int) -> SsdBuffer:
        """The data file of `directory`, grown to `size` bytes (0: as it is), with its manifest."""
        return SsdBuffer(directory, size)

    def allocate(self, size: int, shared: bool = True) -> SsdBuffer:
        """A file-backed scratch buffer in a fresh temporary directory, removed on close."""
        if size < 0:
            raise ValueError(f"buffer size must be >= 0, got {size}")
        return SsdBuffer(tempfile.mkdtemp(prefix="mooncake-ssd-"), max(size, 1), scratch=True)
