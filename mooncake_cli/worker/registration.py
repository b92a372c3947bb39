"""Registration with a conductor: a heartbeat thread POSTing the worker's load; never fatal.

Each registration carries this registrar's random token: the conductor binds the worker's name
to the first token it sees, so no other registrant can take the name over or deregister it.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable
from typing import Any

from mooncake_cli.api.registration import DEREGISTER, REGISTER
from mooncake_cli.http.auth import Signer
from mooncake_cli.http.jsonhttp import call
from mooncake_cli.worker.etcd_registrar import EtcdRegistrar

log = logging.getLogger("mooncake.worker")


class Registrar:
    """POST {conductor}/v1/instances/register with `payload()` every `interval` seconds; on
    `close`, POST /v1/instances/deregister. Failures are logged (once per outage). Requests
    are signed with `auth` (the cluster secret) when given."""

    def __init__(self, conductor: str, payload: Callable[[], dict[str, Any]],
                 interval: float, timeout: float = 5.0, auth: Signer | None = None) -> None:
        self.conductor = conductor.rstrip("/")
        self.payload = payload
        self.interval = interval
        self.timeout = timeout
        self.auth = auth
        self.token = secrets.token_urlsafe(24)
        self.registered = 0  # successful registrations, for tests and logs
        self._failing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mooncake-worker-register",
                                        daemon=True)

    def start(self) -> Registrar:
        self._thread.start()
        return self

    def _post(self, path: str, body: dict[str, Any]) -> bool:
        try:
            answer = call(self.conductor + path, {**body, "token": self.token},
                          timeout=self.timeout, auth=self.auth)
        except OSError as e:
            problem = f"cannot reach conductor {self.conductor}: {e}"
        else:
            if answer.status < 300:
                if self._failing:
                    log.info("conductor %s reachable again", self.conductor)
                self._failing = False
                return True
            problem = f"conductor {self.conductor}{path} answered {answer.status}: {answer.body}"
        if not self._failing:
            log.warning("%s (will keep trying)", problem)
        self._failing = True
        return False

    def _run(self) -> None:
        while True:
            if self._post(REGISTER, self.payload()):
                self.registered += 1
            if self._stop.wait(self.interval):
                return

    def close(self, name: str) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timeout + 1)
        if not self._post(DEREGISTER, {"name": name}):
            log.warning("could not deregister %s from %s", name, self.conductor)


def register_with(conductor: str, payload: Callable[[], dict[str, Any]], interval: float,
                  secret: str = "", auth: Signer | None = None
                  ) -> Registrar | EtcdRegistrar | None:
    """A started registrar for `conductor` (an etcd:// registry, or a conductor's URL), or
    None when there is none: every worker role, whatever its engine, registers this way."""
    if conductor.startswith("etcd://"):
        return EtcdRegistrar(conductor, payload, interval, secret=secret).start()
    if conductor:
        return Registrar(conductor, payload, interval, auth=auth).start()
    return None
