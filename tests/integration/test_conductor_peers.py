"""Conductor replicas (`--peers`): conductors in their own processes on one real etcd share
one decode worker's bookings and the prefix index, and one killed with SIGKILL costs only the
requests it was answering. Workers are real processes of a demo model behind a real store
master; every role runs with the cluster secret, so every shared record is signed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import etcd3gw
import pytest

from mooncake_cli.api.registration import parse
from mooncake_cli.conductor.peer_records import PREFIX
from mooncake_cli.http import jsonhttp
from mooncake_cli.http.auth import signer
from tests.conftest import wait_for
from tests.helpers.conductor_procs import ConductorProc, Load, etcd_bookings, etcd_keys
from tests.helpers.prom import value
from tests.helpers.store_procs import start_master
from tests.helpers.worker_procs import WorkerProc

pytestmark = pytest.mark.timeout(400)  # conductors and workers in processes of their own
SECRET = "peers-test-secret"
CLUSTER = "peers"
BLOCK = 16
DECODE_BLOCKS = 36  # room for two of test 1's answers (15 blocks each), not three
TTL = 3  # the conductors' lease: a killed one's bookings are gone this long after
MODEL = "demo-25m"  # the demo whose decode steps take long enough for bookings to be seen


@pytest.fixture(scope="module")
def workers(etcd: str) -> Iterator[dict[str, Any]]:
    """A store master, prefill workers p0 and p1 and decode worker d0, registered in etcd."""
    master = start_master(0, "--secret", SECRET)
    common = ["--model", MODEL, "--store", master.ready["address"], "--segment-size", "16MiB",
              "--conductor", f"{etcd}/{CLUSTER}", "--heartbeat", "0.5", "--secret", SECRET,
              "--threads", "1"]
    procs = [WorkerProc("prefill", *common, "--name", "p0"),
             WorkerProc("prefill", *common, "--name", "p1"),
             WorkerProc("decode", *common, "--name", "d0", "--kv-blocks", str(DECODE_BLOCKS))]
    try:
        for p in procs:
            p.ready()
        yield {"d0": procs[2], "etcd": etcd}
    finally:
        for p in procs:
            p.stop()
        master.stop()


def start(etcd: str, n: int, *extra: str) -> list[ConductorProc]:
    """`n` conductors with --peers, each serving and seeing every worker."""
    procs = [ConductorProc("--peers", f"{etcd}/{CLUSTER}", "--peer-ttl", str(TTL), "--secret",
                           SECRET, "--model", MODEL, *extra) for _ in range(n)]
    for c in procs:
        c.serving()
        wait_for(c.ok, 60, 0.1, "every worker registered")
    return procs


def ask(url: str, prompt: list[int], max_tokens: int, timeout: float = 120) -> jsonhttp.Answer:
    return jsonhttp.call(url + "/v1/completions",
                         {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                          "temperature": 0, "ignore_eos": True}, timeout=timeout)


def worker_metric(url: str, name: str) -> float:
    return value(jsonhttp.call(url + "/metrics").body["text"], f"mooncake_worker_{name}_total",
                 role="decode")


def views_agree(conductors: list[ConductorProc], etcd: str) -> int | None:
    """The tokens booked on d0 in etcd when every conductor's view (its own bookings plus
    its peers') equals them; None while some view lags."""
    total = sum(etcd_bookings(etcd, CLUSTER).values())
    for c in conductors:
        d0 = c.peers()["decode"].get("d0")  # (not there while its registration lapses)
        if d0 is None or d0["own_tokens"] + d0["peer_tokens"] != total:
            return None
    return total


def test_three_conductors_book_one_decode_worker_without_overbooking(
        workers: dict[str, Any]) -> None:
    """With an SLO set, a booking is the prompt plus the expected output: 15 of d0's 36
    blocks, what the answer will hold. Six requests at once, two at each of the three
    conductors: the bookings in etcd (sampled throughout) never add up to more than d0 holds,
    so d0 never runs more than two answers at once (sampled throughout), preempts a sequence
    or refuses a reservation, and every conductor's view of d0's bookings (its own plus its
    peers') equals etcd's while d0 is full. (A booking is in etcd from the moment it is made,
    before it is known to hold; one that does not is given up before its prefill is sent.)"""
    etcd, d0 = workers["etcd"], workers["d0"]
    failed = worker_metric(d0.url, "requests_failed")
    preempted = worker_metric(d0.url, "preemptions")
    conductors = start(etcd, 3, "--ttft-slo", "600")
    answers: dict[int, jsonhttp.Answer] = {}
    running: list[int] = []
    done = threading.Event()
    auth = signer(SECRET)

    def sample() -> None:
        while not done.is_set():
            load = jsonhttp.call(d0.url + "/v1/load", auth=auth).body
            running.append(load["running"] + load["waiting"] + load["preempted"])
            done.wait(0.02)

    threads = [threading.Thread(target=sample)]
    for i in range(6):
        prompt = [1 + i, *range(40, 79)]  # 40 tokens, a prompt of its own
        threads.append(threading.Thread(target=lambda i=i, u=conductors[i % 3].url, p=prompt:
                                        answers.__setitem__(i, ask(u, p, 200))))
    try:
        for t in threads:
            t.start()
        full = 2 * 15 * BLOCK
        wait_for(lambda: views_agree(conductors, etcd) == full, 120, 0.02, "views of a full d0")
        for t in threads[1:]:
            t.join(300)
    finally:
        done.set()
        threads[0].join(30)
        wait_for(lambda: views_agree(conductors, etcd) == 0, 30, 0.1, "bookings released")
        for c in conductors:
            c.stop()
    assert [answers[i].status for i in range(6)] == [200] * 6, answers
    assert all(a.body["usage"]["completion_tokens"] == 200 for a in answers.values())
    assert max(running) == 2
    waited = [float(a.headers["X-Mooncake-Queue-Wait"]) > 0 for a in answers.values()]
    assert sum(waited) >= 4  # two fit at once: the rest waited in their conductor's queue
    assert worker_metric(d0.url, "preemptions") == preempted
    assert worker_metric(d0.url, "requests_failed") == failed


def test_records_not_signed_with_the_secret_are_ignored(workers: dict[str, Any]) -> None:
    etcd = workers["etcd"]
    [c] = start(etcd, 1)
    (host, port), *_ = parse(etcd)[0]
    client = etcd3gw.client(host=host, port=port)
    lease = client.lease(ttl=30)
    base = f"{PREFIX}{CLUSTER}/bookings/intruder/"
    body = {"conductor": "intruder", "decode": "d0", "tokens": 100000, "lease": str(lease.id)}
    try:
        for i, extra in enumerate([{}, {"signed_at": time.time(), "mac": "0" * 64}]):
            key = f"{base}{i}"
            client.put(key, json.dumps({**body, **extra, "key": key}), lease=lease)
        wait_for(lambda: c.peers()["records_ignored"] >= 2, 30, 0.1, "records refused")
        assert c.peers()["decode"]["d0"]["peer_tokens"] == 0
        assert ask(c.url, [1, 2, 3, 4], 2).status == 200  # d0 is not taken for full
    finally:
        lease.revoke()
        c.stop()


def last_explain(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text().splitlines()[-1]))


def test_a_prefix_learned_through_one_conductor_routes_requests_at_the_others(
        workers: dict[str, Any], tmp_path: Path) -> None:
    """A learns where a 200-token prompt's 12 blocks are; B (running) and C (started after)
    send the same prompt to that prefill instance and reuse all 12 blocks."""
    etcd = workers["etcd"]
    logs = [tmp_path / f"explain-{n}.jsonl" for n in "abc"]
    a, b = (start(etcd, 1, "--explain", str(log))[0] for log in logs[:2])
    c: ConductorProc | None = None
    prompt = [1, *(7 + (i * 37) % 300 for i in range(199))]
    try:
        first = ask(a.url, prompt, 4)
        assert first.status == 200, first.body
        holder = last_explain(logs[0])["prefill"]["instance"]
        wait_for(lambda: b.peers()["index_records_applied"] >= 1, 30, 0.05, "B learns")
        c = start(etcd, 1, "--explain", str(logs[2]))[0]  # caught up before it serves
        for conductor, log in ((b, logs[1]), (c, logs[2])):
            again = ask(conductor.url, prompt, 4)
            assert again.status == 200, again.body
            chosen = last_explain(log)["prefill"]
            assert (chosen["instance"], chosen["local_blocks"]) == (holder, 12)
            assert again.body["usage"]["prompt_tokens_details"]["cached_tokens"] == 12 * BLOCK
    finally:
        for proc in (a, b, c):
            if proc is not None:
                proc.stop()


def test_a_conductor_killed_under_load(workers: dict[str, Any]) -> None:
    etcd = workers["etcd"]
    conductors = start(etcd, 3)
    victim, survivors = conductors[0], conductors[1:]
    victim_id = victim.peers()["conductor"]
    load = Load(conductors, clients=6, ask=lambda url, prompt: ask(url, prompt, 16, 60))
    try:
        wait_for(lambda: all(load.answered(c.url) >= 3 for c in conductors), 120, 0.05,
                 "every conductor answering")
        before = {c.url: load.answered(c.url) for c in survivors}
        victim.kill()
        wait_for(lambda: all(load.answered(c.url) >= before[c.url] + 10 for c in survivors),
                 120, 0.05, "the other two answering after the kill")
        wait_for(lambda: not etcd_keys(etcd, f"{PREFIX}{CLUSTER}/bookings/{victim_id}/")
                 and not etcd_keys(etcd, f"{PREFIX}{CLUSTER}/members/{victim_id}"),
                 TTL + 30, 0.1, "the killed conductor's lease to expire")
        ids = sorted(c.peers()["conductor"] for c in survivors)
        wait_for(lambda: all(c.peers()["conductors"] == ids for c in survivors), 30, 0.1,
                 "the survivors to see each other only")
        load.stop()
        assert wait_for(lambda: views_agree(survivors, etcd) == 0, 30, 0.1,
                        "the survivors' views and etcd to hold no booking")
    finally:
        load.stop()
        for c in conductors:
            c.stop()
    for url, status, body in load.outcomes:
        if status is None:  # only the killed one's requests were lost
            assert url == victim.url, (url, body)
        else:  # never refused: d0 holds every answer (at most 8 of 3 blocks: 6 clients and
            # the 2 the victim left running, in its 36), no SLO is set and the queue is 4096
            assert status == 200, (url, status, body)
    lost = [o for o in load.outcomes if o[1] is None]
    assert len(lost) <= 6  # a client loses one request (then leaves the dead conductor)


def test_bad_peer_urls() -> None:
    from mooncake_cli.config.conductor import ConductorConfig
    from mooncake_cli.interfaces import ConfigError

    with pytest.raises(ConfigError, match="etcd://"):
        ConductorConfig(peers="http://x:1")
    with pytest.raises(ConfigError, match="peer_ttl"):
        ConductorConfig(peers="etcd://127.0.0.1:1", peer_ttl=1)
