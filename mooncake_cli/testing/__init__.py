"""Test doubles for code that uses the transfer engine, built on the transport service-provider
interface (mooncake_cli/transfer/spi.py) alone, as a third party's transport would be.

- `mooncake_cli.testing.memory.MemoryTransport`: engines of one process reach each other's
  memory without sockets; a `handler` may fail slices before any byte moves.
"""
