"""`open_metadata`: the metadata client a URL names. Apart from metadata.py so that no module of
the metadata family imports one that imports it back (http and etcd build on metadata.py)."""

from __future__ import annotations

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.transfer.metadata import MetadataClient, P2PMetadata


def open_metadata(url: str, secret: str | None = None, timeout: float = 5.0,
                  ttl: float = 10.0) -> MetadataClient:
    """A metadata client for `url`; ConfigError for a URL of no known kind."""
    url = (url or "p2p").strip()
    if url.lower() in ("p2p", "p2phandshake"):
        return P2PMetadata(secret, timeout)
    if url.startswith(("http://", "https://")):
        from mooncake_cli.transfer.metadata_http import HttpMetadata

        return HttpMetadata(url, timeout, ttl)
    if url.startswith("etcd://"):
        from mooncake_cli.transfer.metadata_etcd import EtcdMetadata

        return EtcdMetadata(url, timeout, ttl)
    raise ConfigError(f"unknown metadata '{url}': use p2p, http://HOST:PORT/metadata or "
                      "etcd://HOST:PORT[,HOST:PORT]")
