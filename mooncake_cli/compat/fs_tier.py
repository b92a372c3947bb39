"""The persisted tier of upstream's `--root_fs_dir`: one file per object under the directory the
master names (ROOT/CLUSTER_ID), shared by every client that mounts it (a DFS, or one host's disk).

A file is DIR/ab/cd/<sha256 of the key>: a 24-byte header (magic, key length, value size, the
xxh3_64 of the value), the key, the value. It is written to a temporary name and renamed, so a
reader sees a whole file or none, and a value whose checksum does not match is not served.
Directories made here are 0700 and files 0600: other users of a host read no values, and the
clients that share the directory run as one user.
Writes run on one thread in put order, after the put returned (as upstream's); at most
`MAX_QUEUED` bytes wait, a put beyond them waits for room. A value waiting to be written is
read from the queue; removing a key cancels its pending write. What is queued when the
interpreter exits is written first (not when the process is killed).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import secrets
import struct
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import xxhash

from mooncake_cli.store.errors import StoreCode, StoreError
from mooncake_cli.store.records import check_key

MAGIC = b"MCF1"
HEADER = struct.Struct("<4sIQQ")  # magic, key bytes, value bytes, xxh3_64 of the value
MAX_QUEUED = 256 << 20  # bytes of values waiting to be written
PRIVATE_DIR = 0o700  # directories made here (files are 0600): the clients share one user


def _flush_at_exit(ref: weakref.ref[FileTier]) -> None:
    tier = ref()
    if tier is not None:
        tier.flush(30)


class FileTier:
    """Objects as files under `root`, created if missing in a parent that exists (the shared
    mount: never made here, or an unmounted DFS would be filled on the local disk).
    StoreError INTERNAL_ERROR, as upstream's setup fails, when there is none or it cannot be
    written."""

    def __init__(self, root: str, max_queued: int = MAX_QUEUED) -> None:
        self.root = root
        parent = os.path.dirname(root.rstrip("/"))
        if not os.path.isdir(parent):
            raise StoreError(f"the master's root_fs_dir {parent} is not a directory here (is the "
                             f"shared file system mounted?)", StoreCode.INTERNAL_ERROR)
        try:
            os.makedirs(root, PRIVATE_DIR, exist_ok=True)
            probe = os.path.join(root, f".probe-{os.getpid()}-{threading.get_ident()}")
            with open(probe, "wb"):
                pass
            os.unlink(probe)
        except OSError as e:
            raise StoreError(f"the master's root_fs_dir {root} is not writable here: {e}",
                             StoreCode.INTERNAL_ERROR) from None
        self._max = max_queued
        self._cv = threading.Condition()
        self._queue: deque[tuple[str, int]] = deque()
        self._pending: dict[str, tuple[int, bytes]] = {}  # key -> (generation, value)
        self._queued = 0
        self._gen = 0
        self._busy = False
        self._closed = False
        self.on_fail: Callable[[str, OSError], None] = lambda key, e: None
        self._thread = threading.Thread(target=self._write_loop, name="mooncake-fs-tier",
                                        daemon=True)
        self._thread.start()
        atexit.register(_flush_at_exit, weakref.ref(self))

    # -- paths -----------------------------------------------------------------------------------
    def path(self, key: str) -> str:
        """Where `key`'s file is (InvalidKey for what is no key)."""
        h = hashlib.sha256(check_key(key).encode("utf-8")).hexdigest()
        return os.path.join(self.root, h[:2], h[2:4], h)

    # -- writes ----------------------------------------------------------------------------------
    def write(self, key: str, value: bytes) -> None:
        """Persist `value` (a snapshot the caller no longer changes) under `key`, later."""
        with self._cv:
            while self._queued and self._queued + len(value) > self._max and not self._closed:
                self._cv.wait()
            self._gen += 1
            old = self._pending.get(key)
            if old is not None:
                self._queued -= len(old[1])
            self._pending[key] = (self._gen, value)
            self._queued += len(value)
            self._queue.append((key, self._gen))
            self._cv.notify_all()

    def _write_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                key, gen = self._queue.popleft()
                entry = self._pending.get(key)
                if entry is None or entry[0] != gen:
                    continue  # removed, or a later write of the key follows
                self._busy = True
            try:
                self._store(key, gen, entry[1])
            except OSError as e:
                self.on_fail(key, e)
            finally:
                with self._cv:
                    if self._pending.get(key, (None,))[0] == gen:
                        del self._pending[key]
                        self._queued -= len(entry[1])
                    self._busy = False
                    self._cv.notify_all()

    def _store(self, key: str, gen: int, value: bytes) -> None:
        path = self.path(key)
        inner = os.path.dirname(path)
        for d in (os.path.dirname(inner), inner):  # each level private (makedirs: the last)
            try:
                os.mkdir(d, PRIVATE_DIR)
            except FileExistsError:
                pass
        tmp = f"{path}.{os.getpid()}.{gen}.{secrets.token_hex(4)}.tmp"
        raw = key.encode("utf-8")
        try:
            # O_EXCL: never through a link planted at the name; 0600: the values are the user's
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(HEADER.pack(MAGIC, len(raw), len(value), xxhash.xxh3_64_intdigest(value)))
                f.write(raw)
                f.write(value)
            with self._cv:  # a removal in between wins: the file must not come back
                if self._pending.get(key, (None,))[0] == gen:
                    os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is on disk; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and not self._busy, timeout)

    def close(self) -> None:
        self.flush()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=5)

    # -- reads -----------------------------------------------------------------------------------
    @staticmethod
    def _head(f: Any) -> tuple[bytes, int, int] | None:
        """The key (as bytes), value size and checksum a file's header names; None when it has
        none of ours. `f` is left at the value."""
        head = f.read(HEADER.size)
        if len(head) < HEADER.size:
            return None
        magic, nkey, size, digest = HEADER.unpack(head)
        return (f.read(nkey), size, digest) if magic == MAGIC else None

    def _open(self, key: str) -> tuple[Any, int, int] | None:
        """The open file of `key` positioned at its value, the value's size and checksum; None
        if there is none (a file of another key, or not ours, counts as none)."""
        try:
            f = open(self.path(key), "rb")  # noqa: SIM115 - returned to the caller
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreError(f"cannot open the file of {key!r}: {e}",
                             StoreCode.FILE_OPEN_FAIL) from e
        head = self._head(f)
        if head is not None and head[0] == key.encode("utf-8"):
            return f, head[1], head[2]
        f.close()
        return None

    def size(self, key: str) -> int | None:
        with self._cv:
            entry = self._pending.get(key)
        if entry is not None:
            return len(entry[1])
        opened = self._open(key)
        if opened is None:
            return None
        opened[0].close()
        return opened[1]

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def read(self, key: str, alloc: Callable[[int], Any] | None = None) -> Any:
        """The value of `key` as bytes, or in `alloc(size)` (a writable buffer of that many
        bytes, or one that raises); OBJECT_NOT_FOUND when there is no file, FILE_READ_FAIL when
        it is short or its checksum does not match."""
        with self._cv:
            entry = self._pending.get(key)
        if entry is not None:
            if alloc is None:
                return entry[1]
            buf = alloc(len(entry[1]))
            memoryview(buf).cast("B")[:] = entry[1]
            return buf
        opened = self._open(key)
        if opened is None:
            raise StoreError(f"object {key!r} not found", StoreCode.OBJECT_NOT_FOUND)
        f, size, want = opened
        with f:
            if alloc is None:  # one copy, no zero-fill first
                buf = view = f.read(size)
                got = len(buf)
            else:
                buf = alloc(size)
                view = memoryview(buf).cast("B")
                got = f.readinto(view)
        if got != size or xxhash.xxh3_64_intdigest(view) != want:
            raise StoreError(f"the file of {key!r} is damaged (short or checksum mismatch)",
                             StoreCode.FILE_READ_FAIL)
        return buf

    # -- removal ---------------------------------------------------------------------------------
    def remove(self, key: str) -> bool:
        """Drop `key`'s file and any write of it still waiting; whether there was either."""
        with self._cv:
            entry = self._pending.pop(key, None)
            if entry is not None:
                self._queued -= len(entry[1])
                self._cv.notify_all()
            try:
                os.unlink(self.path(key))
            except FileNotFoundError:
                return entry is not None
            return True

    def keys(self) -> Iterator[str]:
        """Every key with a file (or a write waiting)."""
        with self._cv:
            seen = set(self._pending)
        yield from seen
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                if name.endswith(".tmp") or len(name) != 64:
                    continue
                try:
                    with open(os.path.join(dirpath, name), "rb") as f:
                        head = self._head(f)
                except OSError:
                    continue
                if head is not None and (key := head[0].decode("utf-8", "replace")) not in seen:
                    yield key
