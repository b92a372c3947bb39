"""mooncake-cli: the Mooncake KVCache-centric serving architecture in one command."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mooncake-cli")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"
