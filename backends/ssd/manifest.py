"""The manifest of an SSD data file: which object lives where, as an append-only log.

One record a line, `CRC32 JSON` (the CRC of the JSON text, 8 hex digits):

    {"op": "put", "key": K, "offset": O, "size": N, "checksum": C}
    {"op": "del", "offset": O}

Replaying the log gives the live entries: a put replaces every entry it overlaps and any older
entry of the same key; a del forgets the entry at that offset. A line that is torn, fails its
CRC or does not parse is skipped and reported (`problems`), never trusted. Every append is
fsynced; opening compacts the log (temp file + fsync + rename + directory fsync).
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from typing import Any

LOG = "manifest.log"


@dataclass(frozen=True)
class Entry:
    """An object's bytes at [offset, offset+size) of the data file, and their checksum."""

    key: str
    offset: int
    size: int
    checksum: str

    def overlaps(self, offset: int, size: int) -> bool:
        return self.offset < offset + size and offset < self.offset + self.size


def _line(record: dict[str, Any]) -> bytes:
    text = json.dumps(record, separators=(",", ":"), ensure_ascii=True)
    return f"{zlib.crc32(text.encode()):08x} {text}\n".encode()


def _parse(raw: bytes) -> dict[str, Any]:
    """The record on one line; ValueError saying why it cannot be trusted."""
    if not raw.endswith(b"\n"):
        raise ValueError("torn line (no newline)")
    crc, _, text = raw.rstrip(b"\n").partition(b" ")
    if len(crc) != 8 or f"{zlib.crc32(text):08x}".encode() != crc:
        raise ValueError("CRC mismatch")
    record = json.loads(text)
    if not isinstance(record, dict) or record.get("op") not in ("put", "del"):
        raise ValueError("unknown record")
    return record


def _entry(record: dict[str, Any]) -> Entry:
    key, off, size, csum = (record.get(k) for k in ("key", "offset", "size", "checksum"))
    if not (isinstance(key, str) and key and isinstance(csum, str)
            and isinstance(off, int) and off >= 0 and isinstance(size, int) and size > 0):
        raise ValueError("malformed put record")
    return Entry(key, off, size, csum)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Manifest:
    """The live entries of the log in `directory`, kept in memory and appended to durably."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LOG)
        self.problems: list[str] = []  # what the last replay skipped, and why
        self._entries: dict[int, Entry] = {}
        self._replay()
        self._compact()
        self._file = open(self.path, "ab")  # noqa: SIM115 - held open for appends until close

    def _replay(self) -> None:
        try:
            with open(self.path, "rb") as f:
                lines = f.readlines()
        except FileNotFoundError:
            return
        for n, raw in enumerate(lines, 1):
            try:
                record = _parse(raw)
                if record["op"] == "put":
                    self._apply_put(_entry(record))
                else:
                    self._entries.pop(int(record["offset"]), None)
            except (ValueError, TypeError, KeyError) as e:
                self.problems.append(f"{self.path} line {n} skipped: {e}")

    def _apply_put(self, e: Entry) -> None:
        for old in list(self._entries.values()):
            if old.key == e.key or old.overlaps(e.offset, e.size):
                del self._entries[old.offset]
        self._entries[e.offset] = e

    def _compact(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            for e in sorted(self._entries.values(), key=lambda e: e.offset):
                f.write(_line({"op": "put", **e.__dict__}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        _fsync_dir(self.directory)

    def _append(self, record: dict[str, Any]) -> None:
        self._file.write(_line(record))
        self._file.flush()
        os.fsync(self._file.fileno())

    def entries(self) -> list[Entry]:
        """The live entries, by offset."""
        return sorted(self._entries.values(), key=lambda e: e.offset)

    def add(self, entry: Entry) -> None:
        """Record `entry` durably (it replaces entries it overlaps and older ones of its key)."""
        self._append({"op": "put", **entry.__dict__})
        self._apply_put(entry)

    def remove(self, offset: int) -> bool:
        """Forget the entry at `offset`; False if there is none."""
        if offset not in self._entries:
            return False
        self._append({"op": "del", "offset": offset})
        del self._entries[offset]
        return True

    def close(self) -> None:
        self._file.close()
