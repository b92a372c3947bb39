"""Built-in backends of mooncake-cli, installed as `mooncake_backends` and registered through
the same entry points as third-party plugins; the transfer engine cannot start without `tcp`,
which owns its listener (mooncake_cli/transfer/endpoints.py)."""
