"""Sizes and config loading: defaults < TOML file < MOONCAKE_* env < flags, and actionable errors
for unknown keys and bad values."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from mooncake_cli.config import TransferConfig, human_size, load, parse_size, size_field
from mooncake_cli.interfaces import ConfigError


@pytest.mark.parametrize("text,expected", [
    (4096, 4096),
    ("4096", 4096),
    ("0", 0),
    ("64KiB", 64 << 10),
    ("64kib", 64 << 10),
    ("64 KiB", 64 << 10),
    (" 16MB ", 16_000_000),
    ("16MiB", 16 << 20),
    ("1g", 10**9),
    ("1GiB", 1 << 30),
    ("2TiB", 2 << 40),
    ("1.5KiB", 1536),
    ("10b", 10),
    ("3k", 3000),
])
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "12XB", "-1", "1 2", "KiB", "1e6", "0x10", "1,5MiB"])
def test_parse_size_refuses_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_size(text)
    assert repr(text)[1:-1] in str(e.value) or text in str(e.value)
    assert "64KiB" in str(e.value) and "1GiB" in str(e.value)


def test_human_size_round_trips_the_common_units() -> None:
    assert human_size(512) == "512 B"
    assert human_size(64 << 10) == "64 KiB"
    assert human_size(1536) == "1.5 KiB"
    assert parse_size(human_size(16 << 20).replace(" ", "")) == 16 << 20


# -- load() precedence --------------------------------------------------------------------------
def write_toml(tmp_path: Path, text: str) -> str:
    p = tmp_path / "mooncake.toml"
    p.write_text(text)
    return str(p)


def test_defaults() -> None:
    cfg = load(TransferConfig, "transfer", None, env={})
    assert cfg == TransferConfig()
    assert (cfg.host, cfg.port, cfg.metadata, cfg.transport) == ("127.0.0.1", 0, "p2p", "auto")
    assert cfg.slice_size == 4 << 20


def test_precedence_defaults_file_env_flags(tmp_path: Path) -> None:
    path = write_toml(tmp_path, """
[transfer]
port = 1111
metadata = "http://file:8080/metadata"
secret = "from-file"
slice-size = "8MiB"
connections = 2
timeout = 4.5

[bench]
anything = "ignored: another role's table"
""")
    file_only = load(TransferConfig, "transfer", path, env={})
    assert (file_only.port, file_only.metadata, file_only.secret) == \
        (1111, "http://file:8080/metadata", "from-file")
    assert (file_only.slice_size, file_only.connections, file_only.timeout) == (8 << 20, 2, 4.5)
    assert file_only.transport == "auto"  # default where the file is silent

    env = {"MOONCAKE_TRANSFER_PORT": "2222", "MOONCAKE_TRANSFER_SECRET": "from-env",
           "MOONCAKE_TRANSFER_SLICE_SIZE": "1MiB", "MOONCAKE_TRANSFER_TRANSPORT": "", "HOME": "/x"}
    with_env = load(TransferConfig, "transfer", path, env=env)
    assert (with_env.port, with_env.secret, with_env.slice_size) == (2222, "from-env", 1 << 20)
    assert with_env.metadata == "http://file:8080/metadata"  # env is silent: the file wins
    assert with_env.transport == "auto"  # an empty variable counts as unset

    flagged = load(TransferConfig, "transfer", path, env=env, port=3333, secret=None,
                   transport="tcp", slice_size="16MiB")
    assert flagged.port == 3333
    assert flagged.secret == "from-env"  # a None flag (not given) does not override
    assert (flagged.transport, flagged.slice_size) == ("tcp", 16 << 20)
    assert flagged.connections == 2


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOONCAKE_TRANSFER_METADATA_TTL", "2")
    monkeypatch.setenv("MOONCAKE_TRANSFER_CONNECTIONS", "7")
    cfg = load(TransferConfig, "transfer")
    assert (cfg.metadata_ttl, cfg.connections) == (2.0, 7)


def test_missing_section_means_defaults(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[bench_transfer]\nthreads = 4\n")
    assert load(TransferConfig, "transfer", path, env={}) == TransferConfig()


# -- errors ---------------------------------------------------------------------------------------
def test_unknown_key_names_the_key_and_the_known_ones(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[transfer]\nprot = 1\n")
    with pytest.raises(ConfigError) as e:
        load(TransferConfig, "transfer", path, env={})
    msg = str(e.value)
    assert path in msg and "'prot'" in msg and "[transfer]" in msg
    assert "known:" in msg and "port" in msg and "slice_size" in msg


@pytest.mark.parametrize("toml,field", [
    ('port = "eighty"', "port"),
    ('slice-size = "huge"', "slice_size"),
    ('timeout = "soon"', "timeout"),
    ("connections = [1, 2]", "connections"),
])
def test_bad_value_in_file(tmp_path: Path, toml: str, field: str) -> None:
    path = write_toml(tmp_path, f"[transfer]\n{toml}\n")
    with pytest.raises(ConfigError) as e:
        load(TransferConfig, "transfer", path, env={})
    assert path in str(e.value) and field in str(e.value), str(e.value)


@pytest.mark.parametrize("var,value,words", [
    ("MOONCAKE_TRANSFER_PORT", "abc", ["MOONCAKE_TRANSFER_PORT", "'abc'", "port"]),
    ("MOONCAKE_TRANSFER_TIMEOUT", "fast", ["MOONCAKE_TRANSFER_TIMEOUT", "timeout"]),
    ("MOONCAKE_TRANSFER_SLICE_SIZE", "12XB", ["MOONCAKE_TRANSFER_SLICE_SIZE", "slice_size",
                                              "12XB", "64KiB"]),
    ("MOONCAKE_TRANSFER_CONNECTIONS", "1.5", ["MOONCAKE_TRANSFER_CONNECTIONS", "connections"]),
])
def test_bad_value_in_env(var: str, value: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        load(TransferConfig, "transfer", None, env={var: value})
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_bad_flag_value_names_the_flag() -> None:
    with pytest.raises(ConfigError, match="--port"):
        load(TransferConfig, "transfer", None, env={}, port="eighty")
    with pytest.raises(ConfigError, match="--slice-size: bad value '4 pages'.*64KiB"):
        load(TransferConfig, "transfer", None, env={}, slice_size="4 pages")


@pytest.mark.parametrize("kw,match", [
    ({"port": 70000}, "port 70000 is out of range"),
    ({"port": -1}, "out of range"),
    ({"connections": 0}, "at least 1"),
    ({"workers": 0}, "at least 1"),
    ({"slice_size": 1000}, "below 4 KiB"),
    ({"timeout": 0}, "timeout must be > 0"),
    ({"metadata_ttl": 1}, "metadata_ttl >= 2"),
])
def test_out_of_range_values(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load(TransferConfig, "transfer", None, env={}, **kw)


def test_unknown_flag_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="no field"):
        load(TransferConfig, "transfer", None, env={}, bogus=1)


def test_file_problems(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load(TransferConfig, "transfer", str(tmp_path / "nope.toml"), env={})
    broken = write_toml(tmp_path, "[transfer\nport = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(TransferConfig, "transfer", broken, env={})
    not_table = write_toml(tmp_path, 'transfer = "yes"\n')
    with pytest.raises(ConfigError, match=r"\[transfer\] .* must be a table"):
        load(TransferConfig, "transfer", not_table, env={})


def test_config_is_frozen() -> None:
    cfg = TransferConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.port = 1  # type: ignore[misc]


@dataclass(frozen=True)
class Toy:
    verbose: bool = False
    block: int = size_field(4096, "a size")
    label: str = "x"


@pytest.mark.parametrize("raw,value", [("1", True), ("true", True), ("YES", True), ("on", True),
                                       ("0", False), ("false", False), ("No", False),
                                       ("off", False)])
def test_booleans_from_the_environment(raw: str, value: bool) -> None:
    assert load(Toy, "toy", None, env={"MOONCAKE_TOY_VERBOSE": raw}).verbose is value


def test_bad_boolean_and_sizes_in_other_dataclasses(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="MOONCAKE_TOY_VERBOSE: bad value 'maybe'"):
        load(Toy, "toy", None, env={"MOONCAKE_TOY_VERBOSE": "maybe"})
    path = write_toml(tmp_path, '[toy]\nblock = "2MiB"\nverbose = true\n')
    toy = load(Toy, "toy", path, env={"MOONCAKE_TOY_LABEL": "y"})
    assert (toy.block, toy.verbose, toy.label) == (2 << 20, True, "y")


def test_every_role_has_its_own_variables() -> None:
    """Set every role's variables at once: none leaks into another (MOONCAKE_PREFILL was the
    conductor's URLs and the simulator's instance count at the same time)."""
    from mooncake_cli.config.conductor import ConductorConfig
    from mooncake_cli.config.store import StoreConfig
    from mooncake_cli.config.worker import WorkerConfig
    from mooncake_cli.sim.settings import SimConfig

    env = {"MOONCAKE_CONDUCTOR_PORT": "8001", "MOONCAKE_CONDUCTOR_PREFILL": "http://p:1,p:2",
           "MOONCAKE_CONDUCTOR_BLOCK_SIZE": "32", "MOONCAKE_BENCH_TRACE_PREFILL": "3",
           "MOONCAKE_STORE_PORT": "9001", "MOONCAKE_TRANSFER_PORT": "7001",
           "MOONCAKE_PREFILL_KV_BLOCKS": "64", "MOONCAKE_DECODE_KV_BLOCKS": "96",
           "MOONCAKE_PREFILL_BLOCK_SIZE": "8", "MOONCAKE_PORT": "1", "MOONCAKE_PREFILL": "x"}
    conductor = load(ConductorConfig, "conductor", None, env=env)
    assert (conductor.port, conductor.block_size) == (8001, 32)
    assert conductor.prefill == ("http://p:1", "http://p:2")
    assert load(SimConfig, "bench_trace", None, env=env).prefill == 3
    assert load(StoreConfig, "store", None, env=env).port == 9001
    assert load(TransferConfig, "transfer", None, env=env).port == 7001
    prefill = load(WorkerConfig, "prefill", None, env=env, role="prefill")
    decode = load(WorkerConfig, "decode", None, env=env, role="decode")
    assert (prefill.kv_blocks, prefill.block_size) == (64, 8)
    assert (decode.kv_blocks, decode.block_size) == (96, 16)


def test_a_renamed_table_is_named(tmp_path: Path) -> None:
    from mooncake_cli.bench.store import BenchStoreConfig

    path = write_toml(tmp_path, "[bench-store]\nmode = 'local'\n")
    with pytest.raises(ConfigError, match=r"\[bench-store\] is now \[bench_store\]"):
        load(BenchStoreConfig, "bench_store", path, env={})


def test_flag_help_is_the_field_description() -> None:
    from mooncake_cli.config import help_of
    from mooncake_cli.config.conductor import ConductorConfig

    assert help_of(ConductorConfig, "port") == "HTTP port (0: any free) [default: 8000]."
    assert help_of(ConductorConfig, "policy").startswith("random, round-robin")
    assert "[default: 256MiB]" in help_of(
        __import__("mooncake_cli.config.worker", fromlist=["WorkerConfig"]).WorkerConfig,
        "segment_size")
