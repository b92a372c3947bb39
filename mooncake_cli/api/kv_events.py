"""The endpoints of a KV-event publisher (ZMQ, vLLM's convention): where it publishes, and where
its replay ROUTER answers. Shared by the store master that publishes, the settings that check
them, and the conductor that subscribes.

    endpoint_of("5557", "10.0.0.5")    # "tcp://10.0.0.5:5557"
    replay_of("tcp://10.0.0.5:5557")   # "tcp://10.0.0.5:5558"
"""

from __future__ import annotations

from mooncake_cli.interfaces import ConfigError


def endpoint_of(value: str, host: str = "127.0.0.1") -> str:
    """A publisher endpoint from `value`: tcp://HOST:PORT, ipc://PATH, or a bare PORT on
    `host` (the master's listen address)."""
    if value.isdigit():
        value = f"tcp://[{host}]:{value}" if ":" in host else f"tcp://{host}:{value}"
    replay_of(value)  # ConfigError when it is neither
    return value


def replay_of(endpoint: str) -> str:
    """The replay endpoint derived from a publisher's: the next TCP port (0 stays 0: any free
    one), or the IPC path with ".replay" appended."""
    if endpoint.startswith("ipc://"):
        return endpoint + ".replay"
    base, _, port = endpoint.rpartition(":")
    if not endpoint.startswith("tcp://") or not port.isdigit():
        raise ConfigError(f"kv events endpoint {endpoint!r}: use tcp://HOST:PORT or ipc://PATH")
    return f"{base}:{int(port) + 1 if int(port) else 0}"
