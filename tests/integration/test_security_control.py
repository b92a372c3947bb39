"""The control plane against an attacker on the same host (issue 12, part A), on real processes:
a cluster of separately started roles sharing MOONCAKE_SECRET (the conductor with --api-key),
and a `--local` cluster (its secret generated). Unsigned, wrongly signed, replayed and tampered
requests to every internal endpoint are refused; a worker's name cannot be taken over by
another registrant; the local store master refuses unsigned requests; stalled bodies cannot
grow the conductor; the audit log follows one request through every role; a role refuses to
listen beyond loopback without a secret. Legitimate requests are still answered."""

from __future__ import annotations

import json
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq

from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.http import jsonhttp
from mooncake_cli.http.auth import Signer, sign_record
from mooncake_cli.store.wire import protocol
from mooncake_cli.store.wire.rpc import MasterConnection
from tests.conftest import wait_for
from tests.helpers.procs import child_env, jsonl
from tests.helpers.sockets import wait_hung_up, wait_read
from tests.helpers.store_procs import REPO, read_line

pytestmark = pytest.mark.timeout(300)
SECRET, API_KEY = "test-cluster-secret", "test-api-key"
BODY = {"model": "demo", "prompt": "mooncake " * 6, "max_tokens": 4, "temperature": 0,
        "ignore_eos": True}
BEARER = {"Authorization": f"Bearer {API_KEY}"}


def _spawn(*args: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "mooncake_cli", "--json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO,
                            env=child_env(**env))


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p.stdout is not None:
            p.stdout.close()


def _wait_registered(url: str, names: set[str], timeout: float = 60) -> list[dict[str, Any]]:
    """The conductor's instances once every one of `names` is among the live ones."""
    def listed() -> list[dict[str, Any]] | None:
        got = httpx.get(url + "/v1/instances", headers=BEARER).json().get("instances", [])
        return list(got) if {i["name"] for i in got if i["alive"]} >= names else None

    got = wait_for(listed, timeout, what=f"{sorted(names)} to be registered")
    assert isinstance(got, list)
    return got


@pytest.fixture(scope="module")
def roles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Store master, conductor, prefill and decode, each its own process, one secret."""
    audit = tmp_path_factory.mktemp("audit") / "roles.jsonl"
    secret = {"MOONCAKE_SECRET": SECRET}
    procs = [_spawn("store", "master", "--port", "0", **secret),
             _spawn("conductor", "start", "--port", "0", "--model", "demo", "--api-key",
                    API_KEY, "--audit-log", str(audit), **secret)]
    try:
        master = read_line(procs[0], 60)["address"]
        url = read_line(procs[1], 90)["url"]
        for role in ("prefill", "decode"):
            procs.append(_spawn(role, "--model", "demo", "--store", master, "--conductor", url,
                                "--name", f"{role}-0", "--heartbeat", "0.3", "--kv-blocks",
                                "64", "--segment-size", "16MiB", "--audit-log", str(audit),
                                **secret))
        workers = {role: read_line(p, 120)["url"]
                   for role, p in zip(("prefill", "decode"), procs[2:], strict=True)}
        pids = {"conductor_pid": procs[1].pid, "decode_pid": procs[3].pid}
        assert {i["name"] for i in _wait_registered(url, {"prefill-0", "decode-0"})
                if i["alive"]} == {"prefill-0", "decode-0"}
        yield {"master": master, "url": url, "audit": audit, **workers, **pids}
    finally:
        _stop(procs)


def _unsigned_attacks(roles: dict[str, Any]) -> list[tuple[str, str, dict[str, Any] | None]]:
    c, p, d = roles["url"], roles["prefill"], roles["decode"]
    return [(c + "/v1/instances/register", "POST",
             {"name": "prefill-0", "role": "prefill", "url": "http://127.0.0.1:9"}),
            (c + "/v1/instances/register", "POST",
             {"name": "fake", "role": "prefill", "url": "http://127.0.0.1:9"}),
            (c + "/v1/instances/deregister", "POST", {"name": "decode-0"}),
            (p + "/v1/prefill", "POST", {"request_id": "evil", "token_ids": [1, 2, 3],
                                         "decode": "http://127.0.0.1:9"}),
            (p + "/v1/prefetch", "POST", {"request_id": "evil", "token_ids": [1, 2, 3]}),
            (p + "/v1/prefetch/cancel", "POST", {"request_id": "evil"}),
            (d + "/v1/kv/reserve", "POST", {"request_id": "evil", "num_tokens": 1000}),
            (d + "/v1/kv/release", "POST", {"request_id": "evil"}),
            (d + "/v1/generate", "POST", {"request_id": "evil", "token_ids": [1, 2],
                                          "first_token": 3, "stream": False}),
            (d + "/v1/load", "GET", None)]


def test_openai_api_needs_the_api_key(roles) -> None:
    url = roles["url"] + "/v1/completions"
    assert httpx.post(url, json=BODY, timeout=60).status_code == 401
    wrong = httpx.post(url, json=BODY, timeout=60, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    first = httpx.post(url, json=BODY, timeout=60, headers=BEARER)
    assert first.status_code == 200, first.text
    again = httpx.post(url, json=BODY, timeout=60, headers=BEARER)
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    assert httpx.get(roles["url"] + "/v1/models", headers=BEARER).status_code == 200
    assert httpx.get(roles["url"] + "/v1/instances").status_code == 401
    assert httpx.get(roles["url"] + "/health").status_code == 200  # probes stay open


def test_unsigned_and_wrongly_signed_requests_are_refused(roles) -> None:
    wrong = Signer("not-the-secret")
    for url, method, body in _unsigned_attacks(roles):
        for auth in (None, wrong):
            ans = jsonhttp.call(url, body, method=method, auth=auth)
            assert ans.status == 401, (url, auth, ans.body)
            assert "secret" in ans.body["error"]["message"]
    instances = _wait_registered(roles["url"], {"prefill-0", "decode-0"})
    assert sorted((i["name"], i["url"]) for i in instances) == \
        sorted([("prefill-0", roles["prefill"]), ("decode-0", roles["decode"])])
    load = jsonhttp.call(roles["decode"] + "/v1/load", auth=Signer(SECRET)).body
    assert load["free_blocks"] == load["total_blocks"]  # no reservation was made


def test_replayed_and_tampered_requests_are_refused(roles) -> None:
    url = roles["decode"] + "/v1/load"
    name, value = Signer(SECRET).header("GET", "/v1/load", b"")
    headers = {name.decode(): value.decode()}
    assert httpx.get(url, headers=headers).status_code == 200
    assert httpx.get(url, headers=headers).status_code == 401  # the same nonce again
    release = json.dumps({"request_id": "x"}).encode()
    name, value = Signer(SECRET).header("POST", "/v1/kv/release", release)
    tampered = httpx.post(roles["decode"] + "/v1/kv/release", timeout=10,
                          content=json.dumps({"request_id": "y"}).encode(),
                          headers={name.decode(): value.decode(),
                                   "Content-Type": "application/json"})
    assert tampered.status_code == 401 and "body" in tampered.json()["error"]["message"]
    for odd in ("v1 1 n d \xe9", "v1 \xe9 \xe9 \xe9 \xe9", "v2 a b c d", "v1 nan x y z"):
        ans = httpx.get(url, headers={b"X-Mooncake-Auth": odd.encode("latin-1")})
        assert ans.status_code == 401, (odd, ans.text)


def test_a_worker_name_cannot_be_taken_over(roles) -> None:
    """Even a holder of the secret cannot re-register or deregister another's name."""
    insider = Signer(SECRET)
    for token in ("", "guessed"):
        takeover = jsonhttp.call(roles["url"] + "/v1/instances/register",
                                 {"name": "decode-0", "role": "decode", "token": token,
                                  "url": "http://127.0.0.1:9"}, auth=insider)
        assert takeover.status == 403, takeover.body
        leave = jsonhttp.call(roles["url"] + "/v1/instances/deregister",
                              {"name": "decode-0", "token": token}, auth=insider)
        assert leave.status == 403, leave.body
    instances = _wait_registered(roles["url"], {"decode-0"})
    assert {i["name"]: i["url"] for i in instances}["decode-0"] == roles["decode"]
    done = httpx.post(roles["url"] + "/v1/completions", json=BODY, timeout=60, headers=BEARER)
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 4
    lines = [json.loads(line) for line in roles["audit"].read_text().splitlines()]
    joined = [x["name"] for x in lines if x["event"] == "register"]
    assert sorted(joined) == ["decode-0", "prefill-0"]  # heartbeats are not lines
    taken = [x for x in lines if x["event"] == "refused" and x.get("name") == "decode-0"]
    assert [x["status"] for x in taken] == [403] * 4
    assert {x["attempted"] for x in taken} == {"register", "deregister"}


def _threads(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"Threads:\s+(\d+)", text).group(1))  # type: ignore[union-attr]


@pytest.mark.parametrize("target", ["decode", "url"])
def test_10000_idle_connections_leave_room_for_requests(roles, target: str) -> None:
    """A worker answers 4,096 connections at once, the conductor 16,384: idle sockets beyond
    half of that are closed, oldest first, so requests are still served."""
    pid = roles["decode_pid" if target == "decode" else "conductor_pid"]
    host, port, _ = jsonhttp.split(roles[target])
    limit = WorkerConfig.max_connections if target == "decode" else \
        ConductorConfig.max_connections
    rss, threads = _rss(pid), _threads(pid)
    socks = []
    try:
        for _ in range(10_000):
            socks.append(socket.create_connection((host, port), timeout=10))
        wait_hung_up(socks, 10_000 - limit // 2)  # all taken in: the oldest beyond half closed
        if target == "decode":
            ans = jsonhttp.call(roles["decode"] + "/v1/load", auth=Signer(SECRET), timeout=10)
            assert ans.status == 200, ans.body
        else:
            done = httpx.post(roles["url"] + "/v1/completions", json=BODY, timeout=60,
                              headers=BEARER)
            assert done.status_code == 200, done.text
        grown, more = _rss(pid) - rss, _threads(pid) - threads
        print(f"{target}: 10,000 idle connections: RSS +{grown >> 20} MiB, threads +{more}")
        assert grown < 300 << 20 and more < 8
    finally:
        for s in socks:
            s.close()


def _master_refuses(address: str) -> None:
    ctx = zmq.Context()
    try:
        conn = MasterConnection(ctx, address, None, 3.0)
        with pytest.raises(Exception, match="(?i)secret|mac"):
            conn.call(protocol.PutStart("poison", 4096), None)
        conn.close()
    finally:
        ctx.term()


def test_store_master_refuses_unsigned_requests(roles) -> None:
    _master_refuses(roles["master"])


# -- a --local cluster: its own fresh secret -------------------------------------------------
@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    audit = tmp_path_factory.mktemp("audit") / "local.jsonl"
    proc = _spawn("conductor", "start", "--local", "1,1", "--model", "demo", "--port", "0",
                  "--kv-blocks", "64", "--audit-log", str(audit))
    try:
        events = [read_line(proc, 120) for _ in range(4)]
        assert events[-1]["event"] == "serving" and events[-1]["auth"] is True, events
        where = {m.group(1): m.group(2) for e in events[:3]
                 if (m := re.match(r"(\S+)(?: master)? at (\S+)", e["what"]))}
        yield {"url": events[-1]["url"], "master": where["store"], "audit": audit,
               "prefill": where["prefill-0"], "decode": where["decode-0"], "pid": proc.pid}
    finally:
        _stop([proc])


def test_local_cluster_refuses_unsigned_requests(local) -> None:
    for url, method, body in _unsigned_attacks(local):
        assert jsonhttp.call(url, body, method=method).status == 401, url
    done = jsonhttp.call(local["url"] + "/v1/completions", BODY, timeout=60)
    assert done.status == 200 and done.body["usage"]["completion_tokens"] == 4


def test_local_store_master_has_a_secret(local) -> None:
    """The prefix cache cannot be poisoned by a local process writing blocks."""
    _master_refuses(local["master"])


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


def test_stalled_bodies_do_not_grow_the_conductor(local) -> None:
    """100 connections each sending 7 MiB of a body and stalling (no --api-key here)."""
    before = _rss(local["pid"])
    host, port = jsonhttp.split(local["url"])[:2]
    chunk, size = b"x" * (1 << 20), 7 << 20
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {size + 4096}\r\n\r\n").encode()
    socks, sent = [], {}
    sel = selectors.DefaultSelector()
    try:
        for _ in range(100):
            s = socket.create_connection((host, port))
            s.sendall(head)
            s.setblocking(False)
            socks.append(s)
            sent[s] = 0
            sel.register(s, selectors.EVENT_WRITE)
        deadline = time.monotonic() + 20
        while sent and time.monotonic() < deadline:
            for key, _ in sel.select(0.5):
                w = key.fileobj
                assert isinstance(w, socket.socket)
                try:
                    sent[w] += w.send(chunk[: min(len(chunk), size - sent[w])])
                except OSError:  # refused and closed by the server
                    sent[w] = size
                if sent[w] >= size:
                    sel.unregister(w)
                    del sent[w]
        wait_read(port, socks)  # all it was sent is in the conductor (or dropped by it)
        grown = _rss(local["pid"]) - before
        done = jsonhttp.call(local["url"] + "/v1/completions", BODY, timeout=60)
        assert done.status == 200, done.body
        assert grown < 200 << 20, f"the conductor grew by {grown >> 20} MiB"
    finally:
        sel.close()
        for s in socks:
            s.close()


def test_audit_log_follows_a_request_through_every_role(local) -> None:
    done = jsonhttp.call(local["url"] + "/v1/completions", BODY, timeout=60)
    assert done.status == 200
    rid = done.body["id"]
    jsonhttp.call(local["decode"] + "/v1/kv/reserve", {"request_id": "evil", "num_tokens": 9})

    def logged() -> bool:  # each role appends its line once its answer is sent, maybe after
        got = jsonl(local["audit"])  # the caller has it
        return len([x for x in got if x.get("request_id") == rid]) >= 4 and \
            any(x["event"] == "refused" for x in got)

    wait_for(logged, 10, what="every role's line and the refusal in the audit log")
    lines = jsonl(local["audit"])
    # each role writes its line when its answer is sent, so two processes finishing together
    # may append in either order; when each began (ts - duration_s) is the causal order
    ours = sorted((x for x in lines if x.get("request_id") == rid),
                  key=lambda x: x["ts"] - x["duration_s"])
    path = [(x["role"], x["event"]) for x in ours]
    # the prefill worker reserves the decode side's blocks within its prefill
    assert path == [("conductor", "completion"), ("prefill", "prefill"), ("decode", "reserve"),
                    ("decode", "generate")], path
    for x in lines:
        if x.get("request_id") == rid:
            assert x["status"] == 200 and x["duration_s"] > 0 and x["peer"].startswith("127.")
    prefill = next(x for x in lines if x.get("request_id") == rid and x["event"] == "prefill")
    assert prefill["decode"] == local["decode"] and prefill["kv_bytes"] > 0
    refused = [x for x in lines if x["event"] == "refused" and x["path"] == "/v1/kv/reserve"]
    assert refused and refused[-1]["status"] == 401 and refused[-1]["attempted"] == "reserve"


@pytest.mark.parametrize("args", [
    ("conductor", "start", "--host", "0.0.0.0", "--port", "0"),
    ("prefill", "--listen", "0.0.0.0:0"),
    ("store", "master", "--host", "0.0.0.0", "--port", "0"),
    ("transfer", "serve", "--host", "0.0.0.0", "--buffer-size", "1MiB"),
])
def test_beyond_loopback_needs_a_secret(args: tuple[str, ...]) -> None:
    done = subprocess.run([sys.executable, "-m", "mooncake_cli", *args], capture_output=True,
                          cwd=REPO, env=child_env(), timeout=120)
    assert done.returncode == 2, done.stderr
    assert b"--secret-file" in done.stderr and b"MOONCAKE_SECRET" in done.stderr


def test_etcd_registrations_are_signed(etcd: str) -> None:
    """With the secret, the conductor ignores registrations written into etcd by anyone else."""
    import etcd3gw

    from mooncake_cli.api.registration import PREFIX, parse
    from mooncake_cli.conductor.service import ConductorService
    from mooncake_cli.config import TransferConfig
    from mooncake_cli.worker.decode import DecodeWorker

    registry = etcd + "/signed"
    svc = ConductorService(ConductorConfig(port=0, registry=registry, poll_interval=0.2),
                           SECRET).start()
    d = DecodeWorker(WorkerConfig(role="decode", name="d", conductor=registry, heartbeat=0.2,
                                  kv_blocks=32), TransferConfig(secret=SECRET)).start()
    host, port = parse(etcd)[0][0]
    client = etcd3gw.client(host=host, port=port)
    fake = {"name": "fake", "role": "prefill", "url": "http://127.0.0.1:9"}
    client.put(PREFIX + "signed/fake", json.dumps(fake))
    client.put(PREFIX + "signed/forged", json.dumps({**fake, "name": "forged", "mac": "00",
                                                     "signed_at": time.time()}))
    # written after the two above (and its key sorts after theirs): the conductor takes the
    # prefix's keys in order, so once it lists the marker it has decided on both
    marker = {"name": "marker", "role": "prefill", "url": "http://127.0.0.1:9"}
    client.put(PREFIX + "signed/marker", json.dumps(sign_record(SECRET, marker)))

    def seen() -> set[str]:
        return {i["name"] for i in httpx.get(svc.url + "/v1/instances").json()["instances"]}
    try:
        wait_for(lambda: {"d", "marker"} <= seen(), 15, what="d and the marker to register")
        assert seen() == {"d", "marker"}
        assert "mac" in json.loads(client.get(PREFIX + "signed/d")[0])
    finally:
        client.delete_prefix(PREFIX + "signed/")
        d.close()
        svc.close()


def test_secret_file(tmp_path: Path) -> None:
    from mooncake_cli.http.auth import resolve_secret
    from mooncake_cli.interfaces import ConfigError

    f = tmp_path / "secret"
    f.write_text("s3cret\nignored\n")
    assert resolve_secret(None, str(f)) == "s3cret"
    assert resolve_secret("s3cret", str(f)) == "s3cret"
    with pytest.raises(ConfigError, match="disagree"):
        resolve_secret("other", str(f))
    f.write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        resolve_secret(None, str(f))
    with pytest.raises(ConfigError, match="cannot read"):
        resolve_secret(None, str(tmp_path / "missing"))
    assert resolve_secret("flag", None) == "flag" and resolve_secret(None, None) == ""


def test_a_restarted_worker_gets_its_name_back(caplog: pytest.LogCaptureFixture) -> None:
    """The name is free again once its registrant deregisters (or is dropped as silent)."""
    from mooncake_cli.conductor.service import ConductorService
    from mooncake_cli.worker.registration import Registrar

    svc = ConductorService(ConductorConfig(port=0, instance_ttl=0.5), SECRET).start()

    def body(url: str) -> Any:
        return lambda: {"name": "w", "role": "decode", "url": url}

    first = Registrar(svc.url, body("http://127.0.0.1:7001"), 0.1, auth=Signer(SECRET)).start()
    second = Registrar(svc.url, body("http://127.0.0.1:7002"), 0.1, auth=Signer(SECRET))
    try:
        wait_for(lambda: first.registered > 0, 10, what="the first registration")
        second.start()
        wait_for(lambda: any("answered 403" in r.getMessage() for r in caplog.records), 10,
                 what="the second registrant to be refused")
        assert first.registered > 0 and second.registered == 0  # 403 while first holds it

        def url_of_w() -> str | None:
            listed = httpx.get(svc.url + "/v1/instances").json()["instances"]
            return next((i["url"] for i in listed if i["name"] == "w"), None)

        assert url_of_w() == "http://127.0.0.1:7001"
        first.close("w")  # deregisters
        wait_for(lambda: second.registered > 0, 10, what="the second registration")
        assert url_of_w() == "http://127.0.0.1:7002"
    finally:
        second.close("w")
        svc.close()
