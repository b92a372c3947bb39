"""The store master: one state (state.py) and the parts composed on it, behind the facade the
RPC service calls (facade.StoreMaster)."""

from mooncake_cli.store.master.facade import StoreMaster

__all__ = ["StoreMaster"]
