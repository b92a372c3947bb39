"""Engine errors: each says what is wrong and what to do."""

from __future__ import annotations

from mooncake_cli.interfaces import ConfigError, MooncakeError


class ModelError(ConfigError):
    """A checkpoint that cannot be loaded: missing file, unsupported architecture or setting."""


class CacheFull(MooncakeError):
    """The paged KV cache has too few free blocks for the request."""
