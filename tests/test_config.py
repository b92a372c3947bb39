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

    env = {"MOONCAKE_PORT": "2222", "MOONCAKE_SECRET": "from-env",
           "MOONCAKE_SLICE_SIZE": "1MiB", "MOONCAKE_TRANSPORT": "", "HOME": "/x"}
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
    monkeypatch.setenv("MOONCAKE_METADATA_TTL", "2")
    monkeypatch.setenv("MOONCAKE_CONNECTIONS", "7")
    cfg = load(TransferConfig, "transfer")
    assert (cfg.metadata_ttl, cfg.connections) == (2.0, 7)


def test_missing_section_means_defaults(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[bench]\nthreads = 4\n")
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
    ("MOONCAKE_PORT", "abc", ["MOONCAKE_PORT", "'abc'", "port"]),
    ("MOONCAKE_TIMEOUT", "fast", ["MOONCAKE_TIMEOUT", "timeout"]),
    ("MOONCAKE_SLICE_SIZE", "12XB", ["MOONCAKE_SLICE_SIZE", "slice_size", "12XB", "64KiB"]),
    ("MOONCAKE_CONNECTIONS", "1.5", ["MOONCAKE_CONNECTIONS", "connections"]),
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
    assert load(Toy, "toy", None, env={"MOONCAKE_VERBOSE": raw}).verbose is value


def test_bad_boolean_and_sizes_in_other_dataclasses(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="MOONCAKE_VERBOSE: bad value 'maybe'"):
        load(Toy, "toy", None, env={"MOONCAKE_VERBOSE": "maybe"})
    path = write_toml(tmp_path, '[toy]\nblock = "2MiB"\nverbose = true\n')
    toy = load(Toy, "toy", path, env={"MOONCAKE_LABEL": "y"})
    assert (toy.block, toy.verbose, toy.label) == (2 << 20, True, "y")
