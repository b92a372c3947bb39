"""One frozen config dataclass per role. Precedence: defaults < TOML file < env < flags.

Each role has one table name, used for its TOML table and its environment prefix alike
(`TABLES`): `[conductor]` and MOONCAKE_CONDUCTOR_PORT, `[bench_trace]` and
MOONCAKE_BENCH_TRACE_PREFILL, so no two roles share a variable. Keys may use dashes. Sizes
accept "64KiB", "16MB", "1GiB" or plain bytes, parsed here only (`parse_size`). A field's
`metadata["help"]` (see `described`) is the one description of the setting: the typer help of
its flag and the man page both read it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

from mooncake_cli.interfaces import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
          "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in "64KiB", "16MB", "1g" or 4096; ConfigError with the accepted forms otherwise."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"bad size '{text}': use bytes or a unit such as 64KiB, 16MB, 1GiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def size_field(default: int, help: str = "") -> Any:
    return field(default=default, metadata={"size": True, "help": help})


def described(default: Any, help: str) -> Any:
    """A config field with its description (the flag's help and the man page's text)."""
    return field(default=default, metadata={"help": help})


# the one table name of each role -> its config class ("module:Class"); the env prefix is
# MOONCAKE_<TABLE>_ (upper case)
TABLES = {
    "conductor": "mooncake_cli.config.conductor:ConductorConfig",
    "prefill": "mooncake_cli.config.worker:WorkerConfig",
    "decode": "mooncake_cli.config.worker:WorkerConfig",
    "store": "mooncake_cli.config.store:StoreConfig",
    "transfer": "mooncake_cli.config:TransferConfig",
    "bench_transfer": "mooncake_cli.bench.transfer:BenchTransferConfig",
    "bench_store": "mooncake_cli.bench.store:BenchStoreConfig",
    "bench_workers": "mooncake_cli.bench.workers:BenchWorkersConfig",
    "bench_trace": "mooncake_cli.sim.settings:SimConfig",
    "bench_profile": "mooncake_cli.bench.profile:ProfileConfig",
}
RENAMED = {"bench": "bench_transfer", "bench-store": "bench_store",
           "bench-workers": "bench_workers", "bench-trace": "bench_trace",
           "bench-profile": "bench_profile"}


def env_name(section: str, name: str) -> str:
    """The environment variable of field `name` of table `section`."""
    return f"MOONCAKE_{section.upper().replace('-', '_')}_{name.upper()}"


def help_of(cls: type, name: str, unit: str = "") -> str:
    """The flag help of field `name`: its description and its default."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    text = f.metadata.get("help", "").rstrip(".")
    d = f.default
    if f.metadata.get("size") and isinstance(d, int):
        shown = human_size(d).replace(" ", "")
    elif isinstance(d, (tuple, list)):
        shown = ",".join(map(str, d)) or "none"
    else:
        shown = str(d).lower() if isinstance(d, bool) else (str(d) if d != "" else "none")
    return f"{sentence(text)} [default: {shown}{unit}]."


def sentence(text: str) -> str:
    """`text` starting with a capital, unless it starts with a value ("cpu, cuda ...")."""
    first = text.split(" ", 1)[0]
    return text[:1].upper() + text[1:] if first.isalpha() and first.islower() else text


@dataclass(frozen=True)
class TransferConfig:
    """A transfer engine: its listener, segment name, metadata and transport choices."""

    host: str = "127.0.0.1"  # listener bind address; loopback unless told otherwise
    port: int = 0  # 0 picks a free port
    advertise: str = ""  # address peers use to reach us; default: host (hostname for 0.0.0.0)
    name: str = ""  # segment name; default HOST:PORT (required to be that with p2p metadata)
    metadata: str = "p2p"
    transport: str = "auto"  # auto picks the best reachable transport per peer
    secret: str = ""
    encrypt: bool = False  # TLS on the tcp transport (needs the secret)
    connections: int = 4  # per peer
    workers: int = 4
    slice_size: int = size_field(4 << 20, "largest slice of one request")
    timeout: float = 10.0  # seconds, per socket operation and per connect
    metadata_ttl: float = 10.0

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port {self.port} is out of range 0-65535")
        if self.connections < 1 or self.workers < 1:
            raise ConfigError("connections and workers must be at least 1")
        if self.slice_size < 4096:
            raise ConfigError(f"slice_size {self.slice_size} is below 4 KiB")
        if self.timeout <= 0 or self.metadata_ttl < 2:
            raise ConfigError("timeout must be > 0 and metadata_ttl >= 2 seconds")


C = TypeVar("C")


def _coerce(cls: type, f: dataclasses.Field[Any], value: Any, source: str) -> Any:
    kind = get_type_hints(cls)[f.name]
    try:
        if f.metadata.get("size"):
            try:
                return parse_size(value)
            except ConfigError as e:  # say where the bad size came from and what it sets
                raise ConfigError(f"{source}: bad value {value!r} for {f.name}: {e}") from e
        if kind is bool and isinstance(value, str):
            if value.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(value)
            return value.lower() in ("1", "true", "yes", "on")
        if kind in (int, float, str, bool):
            return kind(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source}: bad value {value!r} for {f.name}: {e}") from e
    return value


def read_toml(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from e


def load(cls: type[C], section: str, file: str | None = None,
         env: Mapping[str, str] | None = None, **flags: Any) -> C:
    """Build `cls` from defaults, the file's [section], MOONCAKE_<SECTION>_* env and non-None
    flags."""
    env = os.environ if env is None else env
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    doc = read_toml(file)
    for old, new in RENAMED.items():
        if new == section and old in doc:
            raise ConfigError(f"{file}: the table [{old}] is now [{new}]")
    table = doc.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"[{section}] in {file} must be a table")
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in fields:
            raise ConfigError(f"{file}: unknown key '{key}' in [{section}] "
                              f"(known: {', '.join(sorted(fields))})")
        values[name] = _coerce(cls, fields[name], value, str(file))
    for name, f in fields.items():
        var = env_name(section, name)
        raw = env.get(var)
        if raw is not None and raw != "":
            values[name] = _coerce(cls, f, raw, var)
    for name, value in flags.items():
        if name not in fields:
            raise TypeError(f"{cls.__name__} has no field {name}")
        if value is not None:
            values[name] = _coerce(cls, fields[name], value, f"--{name.replace('_', '-')}")
    return cls(**values)
