"""Mooncake-format traces: one JSON object per line with `timestamp` (ms), `input_length`,
`output_length` and `hash_ids` (one id per 512-token block, the last one possibly partial).

A trace is a file (plain or gzipped, by its `.gz` suffix) or the name of one shipped with the
package (`PACKAGED`, in mooncake_cli/data): `load_trace("conversation")` reads the FAST'25
conversation trace on any install.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TextIO

from mooncake_cli.interfaces import ConfigError

TRACE_BLOCK_TOKENS = 512
PACKAGED = {"conversation": "conversation_trace.jsonl.gz"}  # name -> file in mooncake_cli/data
DEFAULT_TRACE = "conversation"


@dataclass(frozen=True)
class TraceRequest:
    """One line of a trace, with its arrival time in seconds after time scaling."""

    index: int
    arrival: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


def _int(doc: dict[str, object], key: str, where: str) -> int:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or int(v) != v:
        raise ConfigError(f"{where}: '{key}' must be an integer >= 0, not {v!r}")
    return int(v)


def _open(path: str) -> TextIO:
    """The lines of file `path`, or of the packaged trace named `path` when no file is there."""
    try:
        if path in PACKAGED and not os.path.exists(path):
            raw = (resources.files("mooncake_cli") / "data" / PACKAGED[path]).open("rb")
            return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8")
        if path.endswith(".gz"):
            return gzip.open(path, "rt", encoding="utf-8")
        return open(path, encoding="utf-8")
    except FileNotFoundError:
        names = ", ".join(PACKAGED)
        raise ConfigError(f"trace {path} does not exist (packaged traces: {names})") from None


def load_trace(path: str, time_scale: float = 1.0, limit: int | None = None) -> list[TraceRequest]:
    """Requests of `path` (a file, or a name in PACKAGED) sorted by arrival; timestamps are
    divided by `time_scale`.

    ConfigError names the file and line of anything malformed."""
    if not time_scale > 0:
        raise ConfigError(f"--time-scale must be > 0, not {time_scale}")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1, not {limit}")
    out: list[TraceRequest] = []
    with _open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{where}: not JSON ({e.msg})") from None
            if not isinstance(doc, dict):
                raise ConfigError(f"{where}: expected a JSON object")
            ids = doc.get("hash_ids")
            if not isinstance(ids, list) or not all(
                    isinstance(h, int) and not isinstance(h, bool) for h in ids):
                raise ConfigError(f"{where}: 'hash_ids' must be a list of integers")
            n = _int(doc, "input_length", where)
            if n < 1:
                raise ConfigError(f"{where}: 'input_length' must be >= 1")
            if len(ids) * TRACE_BLOCK_TOKENS < n:
                raise ConfigError(f"{where}: {len(ids)} hash_ids cover fewer than the "
                                  f"{n} input tokens ({TRACE_BLOCK_TOKENS} per block)")
            ts = doc.get("timestamp")
            if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
                raise ConfigError(f"{where}: 'timestamp' must be milliseconds >= 0, not {ts!r}")
            out.append(TraceRequest(len(out), ts / 1000.0 / time_scale, n,
                                    _int(doc, "output_length", where), tuple(ids)))
    if not out:
        raise ConfigError(f"trace {path} holds no request")
    out.sort(key=lambda r: (r.arrival, r.index))
    return out


def prefix_ceiling(reqs: Sequence[TraceRequest], block_tokens: int = TRACE_BLOCK_TOKENS) -> float:
    """Share of input tokens an infinite cache shared by all instances could reuse: each
    request's longest prefix of blocks seen in any earlier request."""
    seen: set[int] = set()
    hit = total = 0
    for r in reqs:
        k = 0
        for h in r.hash_ids:
            if h not in seen:
                break
            k += 1
        hit += min(k * block_tokens, r.input_tokens)
        total += r.input_tokens
        seen.update(r.hash_ids)
    return hit / total if total else 0.0
