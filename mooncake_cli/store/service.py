"""The master's RPC service: a zmq ROUTER socket answering `protocol` requests, plus a ticker.

    service = MasterService(StoreMaster(), port=50051, secret="s3cret")
    ...
    service.close()

`python -m mooncake_cli.store.service --port P [--host H] [--secret S] [--client-ttl T ...]
[--eviction POLICY] [--metrics-port M] [--ha etcd://H:P[/CLUSTER]]` prints one JSON line
{"event": "ready", "address": "H:P"} (with "metrics": "http://H:M/metrics" when --metrics-port
is given, "ha" with --ha) and serves until SIGTERM or SIGINT; with --ha it serves only while
elected (election.py).

With `metrics_port` (0 picks a free one) the service also serves Prometheus /metrics and /health
on that HTTP port of the same host (see mooncake_cli.store.metrics); None, the default, is off.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from functools import partial

import zmq

from mooncake_cli.api.kv_events import endpoint_of
from mooncake_cli.config.store import StoreConfig
from mooncake_cli.heap import wait_settling
from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.signals import StopFlag, stop_signals
from mooncake_cli.store.errors import StoreCode, StoreError
from mooncake_cli.store.ha.acks import Acks, Pending
from mooncake_cli.store.ha.leader import LeaderInfo, NotLeader
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.master.events import ObjectEvents
from mooncake_cli.store.metrics import MetricsServer
from mooncake_cli.store.wire import curve, protocol
from mooncake_cli.store.wire.fastlane import serve_lane

log = logging.getLogger("mooncake.store")
# requests whose master methods defer work past their answer (see MasterService.serve)
_DEFERS = frozenset((protocol.BatchPutStart, protocol.BatchPutEnd, protocol.BatchGetReplicaList))


def _internal(e: Exception) -> protocol.Reply:
    """The answer to a request that met a bug (logged with its traceback)."""
    log.exception("store request failed")
    return protocol.error(StoreError(f"internal error: {type(e).__name__}: {e}"))


class MasterService:
    """Serves `master` on tcp://host:port (port 0 picks a free one; see `.address`)."""

    def __init__(self, master: StoreMaster, host: str = "127.0.0.1", port: int = 50051,
                 secret: str | None = None, tick_interval: float = 1.0,
                 metrics_port: int | None = None, starting: bool = False,
                 encrypt: bool | None = None) -> None:
        self.master = master
        # HA (election.HaMaster sets these): while `standby` is set, every request but
        # who_leads is refused with NotLeader(standby()); `leader` answers who_leads.
        # `starting`: refuse ("not ready, retry") until HaMaster takes over
        self.standby: Callable[[], str] | None = self._not_ready if starting else None
        self.leader: Callable[[], LeaderInfo] = lambda: LeaderInfo(self.address)
        self.acks = Acks()  # held answers: long polls, and durable puts/removes under HA
        self._secret = secret.encode() if secret else None
        self._tick_interval = tick_interval
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE)
        try:
            if curve.wanted(encrypt):  # CurveZMQ keyed by the secret (wire/curve.py)
                curve.secure_server(self._sock, self._secret)
        except MooncakeError:
            self._sock.close()
            self._ctx.term()
            raise
        try:
            if port == 0:
                self.port = self._sock.bind_to_random_port(f"tcp://{host}")
            else:
                self._sock.bind(f"tcp://{host}:{port}")
                self.port = port
        except zmq.ZMQError as e:
            self._sock.close()
            self._ctx.term()
            raise StoreError(f"cannot listen on {host}:{port}: {e}", StoreCode.RPC_FAIL) from e
        self.address = f"{host}:{self.port}"
        self.metrics: MetricsServer | None = None
        if metrics_port is not None:
            try:
                self.metrics = MetricsServer(lambda: self.master.stats(), host, metrics_port)
            except (OSError, OverflowError) as e:  # in use, not allowed, or out of range
                self._sock.close()
                self._ctx.term()
                raise StoreError(f"cannot serve metrics on {host}:{metrics_port}: {e}",
                                 StoreCode.RPC_FAIL) from e
        self.metrics_url = self.metrics.url if self.metrics else None
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._serve, name="mooncake-store-rpc",
                                          daemon=True),
                         threading.Thread(target=self._tick, name="mooncake-store-tick",
                                          daemon=True)]
        for t in self._threads:
            t.start()
        if self.metrics:
            self.metrics.start()
        self.lane = serve_lane(self.address, self._lane_serve, self._secret)  # same-host fast path

    # -- serving ---------------------------------------------------------------------------------
    def _not_ready(self) -> str:
        return f"store master {self.address} is starting: not ready, retry"

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self.acks.fileno(), zmq.POLLIN)
        held: list[tuple[list[bytes], Pending]] = []  # (ident + delimiter, answer held back)
        while not self._stop.is_set():
            wait = min([100.0, *((h.deadline - time.monotonic()) * 1000 for _, h in held)])
            events = dict(poller.poll(max(0, int(wait))))
            if self.acks.fileno() in events:
                self.acks.drain()
            if events.get(self._sock):
                try:
                    frames = self._sock.recv_multipart(zmq.NOBLOCK)
                except zmq.ZMQError:
                    frames = []
                if frames:
                    ident, rest = frames[:1], frames[1:]
                    delim = [b""] if len(rest) > 1 and rest[0] == b"" else []  # a REQ peer's
                    to = [*ident, *delim]
                    held_back = self.serve(rest[len(delim):], partial(self._send, to))
                    if held_back is not None:
                        held.append((to, held_back))
                        self.acks.loop_holds = True
            now, still = time.monotonic(), []
            for to, h in held:
                if h.ready() or now >= h.deadline:
                    self._send(to, protocol.encode(h.reply()))
                else:
                    still.append((to, h))
            held = still
            self.acks.loop_holds = bool(held)

    def _send(self, to: list[bytes], body: bytes) -> None:
        out = [*to, body]
        if self._secret is not None:
            out.append(protocol.mac(self._secret, body))
        try:
            self._sock.send_multipart(out, zmq.NOBLOCK)
        except zmq.ZMQError as e:  # the peer went away: nothing to answer
            log.debug("reply dropped: %s", e)

    def serve(self, frames: list[bytes], send: Callable[[bytes], None]) -> Pending | None:
        """Answer one request by `send`, or return the answer held back. The work a request
        defers (MasterState.defer: admitting a batch's puts, completing them, leases) runs
        right after `send`, the master's lock held all along: nobody sees the state without
        it, and the caller goes on while the master finishes. Never raises but `send`'s."""
        request = self._request(frames)
        if type(request) not in _DEFERS or self.acks.durable:  # durable: acks collect marks
            answer = self._answer(request)
            if isinstance(answer, Pending):
                return answer
            send(answer)
            return None
        st = self.master.state
        with st.lock:
            later: list[Callable[[], None]] = []
            st.later = later
            try:
                answer = self._answer(request)
            finally:
                st.later = None
            try:
                if isinstance(answer, Pending):
                    return answer  # (none of these is held back today)
                send(answer)
            finally:
                for work in later:
                    try:
                        work()
                    except Exception:  # a bug must not take the master down
                        log.exception("deferred store work failed")
        return None

    def _lane_serve(self, frames: list[bytes], send: Callable[[bytes], None]) -> None:
        held_back = self.serve(frames, send)
        if held_back is not None:
            send(protocol.encode(self.acks.block(held_back)))

    def _request(self, frames: list[bytes]) -> protocol.Request | bytes:
        """The request in `frames`, or the encoded refusal of it."""
        try:
            if len(frames) not in (1, 2):
                raise StoreError(f"a request is 1 or 2 frames, not {len(frames)}",
                                 StoreCode.INVALID_PARAMS)
            body = frames[0]
            if self._secret is not None and (
                    len(frames) != 2 or not protocol.mac_ok(self._secret, body, frames[1])):
                raise StoreError("request refused: missing or bad MAC (wrong secret?)",
                                 StoreCode.RPC_FAIL)
            return protocol.decode_request(body)
        except StoreError as e:
            return protocol.encode(protocol.error(e))
        except Exception as e:  # a bug must not take the master down
            return protocol.encode(_internal(e))

    def _answer(self, request: protocol.Request | bytes) -> bytes | Pending:
        if isinstance(request, bytes):
            return request
        try:
            refusal = self.standby
            if type(request) is protocol.WhoLeads:
                reply = protocol.ok(self.leader())
            elif refusal is not None:
                raise NotLeader(refusal())
            else:
                answer = self.acks.run(lambda: self.master, request)
                if isinstance(answer, Pending):
                    return answer
                reply = answer
        except StoreError as e:
            reply = protocol.error(e)
        except Exception as e:  # a bug must not take the master down
            reply = _internal(e)
        return protocol.encode(reply)

    def _tick(self) -> None:
        while not self._stop.wait(self._tick_interval):
            try:
                report = self.master.tick()
            except Exception:
                log.exception("store tick failed")
                continue
            if report.dead_clients:
                log.info("clients gone: %s (%d keys lost)", ", ".join(report.dead_clients),
                         len(report.lost_keys))

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self.lane:
            self.lane.close()
        if self.metrics:
            self.metrics.close()
        for t in self._threads:
            t.join(timeout=5)
        self._sock.close()
        self._ctx.term()
        self.acks.close()

    def __enter__(self) -> MasterService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def truth(value: str) -> bool:
    """upstream's gflags booleans: true/false, 1/0, yes/no."""
    v = value.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not true or false")


def main(argv: list[str] | None = None) -> int:
    from mooncake_cli.config import load

    ap = argparse.ArgumentParser(prog="python -m mooncake_cli.store.service")
    ap.add_argument("--port", type=int)
    ap.add_argument("--host")
    ap.add_argument("--secret")
    ap.add_argument("--encrypt", action="store_true", default=None,
                    help="CurveZMQ keyed by the secret (clients: MOONCAKE_STORE_ENCRYPT=1)")
    ap.add_argument("--metrics-port", type=int,
                    help="serve Prometheus /metrics and /health here (0: any free port)")
    ap.add_argument("--ha", help="etcd://HOST:PORT[,...][/CLUSTER]: run as an HA candidate")
    ap.add_argument("--kv-events", help="publish object events on this ZMQ endpoint (or PORT)")
    ap.add_argument("--kv-events-replay", help="their replay endpoint (default: derived)")
    ap.add_argument("--config", help="TOML file with a [store] table")
    ap.add_argument("--eviction", help="eviction policy: lru (default), lfu, adaptive, arc, "
                                       "prefix or a plugin's")
    for name in ("lease-ttl", "put-timeout", "client-ttl", "high-watermark", "eviction-ratio",
                 "soft-pin-ttl"):
        ap.add_argument(f"--{name}", type=float)
    for name in ("enable-offload", "offload-on-evict", "promotion-on-hit"):
        ap.add_argument(f"--{name}", type=truth, metavar="true|false")
    ap.add_argument("--promotion-admission-threshold", type=int)
    ap.add_argument("--root-fs-dir", help="directory clients of the upstream API persist to")
    ap.add_argument("--cluster-id", help="the subdirectory of --root-fs-dir (mooncake_cluster)")
    args = vars(ap.parse_args(argv))
    file = args.pop("config")
    try:
        cfg = load(StoreConfig, "store", file, **args)
        events = events_from(cfg)
    except MooncakeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        master = master_from(cfg, events)
    except MooncakeError as e:
        print(f"error: {e}", file=sys.stderr)
        if events is not None:
            events.close()
        return 2
    with stop_signals() as stop:
        try:
            return _serve(cfg, master, stop, events)
        finally:
            if events is not None:
                events.close()


def _serve(cfg: StoreConfig, master: StoreMaster, stop: StopFlag,
           events: ObjectEvents | None = None) -> int:
    """Serve `master` as `cfg` says until `stop` is set; the exit code."""
    from mooncake_cli.store.ha.election import HaMaster

    try:
        service = MasterService(master, cfg.host, cfg.port, cfg.secret or None,
                                metrics_port=None if cfg.metrics_port < 0 else cfg.metrics_port,
                                starting=bool(cfg.ha), encrypt=cfg.encrypt)
    except MooncakeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    ha = HaMaster(service, cfg.ha, lambda: master_from(cfg, events)) if cfg.ha else None
    ready = {"event": "ready", "address": service.address}
    if events is not None:
        events.backend_id = service.address
        ready.update(kv_events=events.endpoint, kv_events_replay=events.replay_endpoint)
    if service.metrics_url:
        ready["metrics"] = service.metrics_url
    if cfg.ha:
        ready["ha"] = cfg.ha
    print(json.dumps(ready), flush=True)
    try:
        wait_settling(stop)
    finally:
        if ha is not None:
            ha.close()
        service.close()
    return 0


def events_from(cfg: StoreConfig, backend_id: str = "") -> ObjectEvents | None:
    """The object-event publisher `cfg` asks for (bound now), or None."""
    if not cfg.kv_events:
        return None
    endpoint = endpoint_of(cfg.kv_events, cfg.host)
    replay = endpoint_of(cfg.kv_events_replay, cfg.host) if cfg.kv_events_replay else None
    return ObjectEvents(endpoint, replay, backend_id=backend_id)


def master_from(cfg: StoreConfig, events: ObjectEvents | None = None) -> StoreMaster:
    """A master with the policy of `cfg`, its object changes published by `events` (which
    announces the new state with `cleared`)."""
    master = StoreMaster(lease_ttl=cfg.lease_ttl, put_timeout=cfg.put_timeout,
                         client_ttl=cfg.client_ttl, high_watermark=cfg.high_watermark,
                         eviction_ratio=cfg.eviction_ratio, eviction=cfg.eviction,
                         soft_pin_ttl=cfg.soft_pin_ttl,
                         offload_on_evict=cfg.enable_offload and cfg.offload_on_evict,
                         promotion_on_hit=cfg.enable_offload and cfg.promotion_on_hit,
                         promotion_threshold=cfg.promotion_admission_threshold,
                         fs_dir=os.path.join(cfg.root_fs_dir, cfg.cluster_id)
                         if cfg.root_fs_dir else "")
    if events is not None:
        events.attach(master)
    return master


if __name__ == "__main__":
    sys.exit(main())
