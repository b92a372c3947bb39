"""Who may speak for a worker name: the first registrant's token binds the name.

    ids = Identities(instances)
    ids.claim(reg.name, reg.token)       # before instances.register; 403 if bound to another
    ids.release(name, token)             # before instances.deregister; 403 likewise

A worker sends a random token (made at its start) with every registration. While the name is
registered, only that token refreshes or deregisters it; a name of a static instance (from the
conductor's --prefill/--decode) is never taken by a registration. Once the instance is gone
(deregistered, or dropped after 3 x ttl of silence) the name is free again.
"""

from __future__ import annotations

import hashlib
import hmac
import threading

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.conductor.instances import Instances


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Identities:
    def __init__(self, instances: Instances) -> None:
        self.instances = instances
        self._bound: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def claim(self, name: str, token: str) -> None:
        """Bind `name` to `token`, or check it is bound to it; ServingError 403 otherwise."""
        with self._lock:
            inst = self.instances.get(name)
            if inst is not None and inst.static:
                raise self._taken(name, "a static instance of this conductor")
            bound = self._bound.get(name)
            if inst is None or bound is None:
                self._bound[name] = _digest(token)
            elif not hmac.compare_digest(bound, _digest(token)):
                raise self._taken(name, "registered by another worker")

    def release(self, name: str, token: str) -> None:
        """Check `token` may deregister `name` and forget the binding; 403 otherwise."""
        with self._lock:
            inst = self.instances.get(name)
            bound = self._bound.get(name)
            if inst is not None and inst.static:
                raise self._taken(name, "a static instance of this conductor")
            if inst is not None and bound is not None and \
                    not hmac.compare_digest(bound, _digest(token)):
                raise self._taken(name, "registered by another worker")
            self._bound.pop(name, None)

    @staticmethod
    def _taken(name: str, why: str) -> ServingError:
        return ServingError(ErrorCode.FORBIDDEN, f"the instance name {name!r} is {why}: only "
                            "its own registrant may re-register or deregister it", "name")
