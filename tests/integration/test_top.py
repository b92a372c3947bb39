"""`mooncake top` against a live `conductor start --local 2,1` cluster of the real model: the
live view under tmux shows every instance and the four figures, refreshes in place and quits
on q; `--once --json` gives the figures the cluster's own /metrics hold."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_cli.http import jsonhttp
from tests.conftest import wait_for
from tests.helpers.live_cluster import LiveCluster
from tests.helpers.procs import child_env
from tests.helpers.prom import samples
from tests.helpers.store_procs import REPO, Proc, read_line, start_master, start_node

pytestmark = pytest.mark.timeout(900)
# long enough for whole 16-token blocks: the second request reuses the first one's prefix
PROMPT = ("The moon is a cake made of cheese, said the old sailor to the children who gathered "
          "around the fire on the beach every night of the long summer, and they all laughed")
NAMES = {"prefill-0", "prefill-1", "decode-0"}
FIGURES = ("prefix-cache hit ratio", "cache size", "evictions", "bytes moved")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LiveCluster]:
    c = LiveCluster("2,1")
    try:
        c.complete(PROMPT)
        again = c.complete(PROMPT)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, again
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def store() -> Iterator[Proc]:
    """A store master with its metrics port, one node's segment mounted and one object."""
    master = start_master(0, "--metrics-port", "0")
    node = start_node(master.ready["address"])
    try:
        assert node.ask(cmd="put", key="top-k", size=4096, seed=1, replicas=1)["ok"]
        yield master
    finally:
        node.stop()
        master.stop()


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return samples(jsonhttp.call(url + "/metrics").body["text"])


def summed(got: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str) -> float:
    return sum(v for (n, _), v in got.items() if n == name)


def top(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mooncake_cli", "top", *args],
                          capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=120)


def once_json(url: str, *args: str) -> dict[str, Any]:
    done = top("--conductor", url, "--once", "--json", *args)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_once_json_gives_every_instance_and_the_clusters_own_figures(
        cluster: LiveCluster) -> None:
    snap = once_json(cluster.url, "--ttft-slo", "60", "--tbt-slo", "2.5")
    c = scrape(cluster.url)
    rows = {i["name"]: i for i in snap["instances"]}
    assert set(rows) == NAMES and all(i["alive"] for i in rows.values())
    assert all(i["metrics_error"] is None and i["kv_total_blocks"] == 128 for i in rows.values())
    f = snap["figures"]
    conductor_ratio = c[("mooncake_conductor_prefix_hit_ratio", frozenset())]
    assert f["prefix_hit_ratio"] == conductor_ratio > 0
    indexed = summed(c, "mooncake_conductor_cached_blocks")
    assert f["cache_size"]["indexed_blocks"] == indexed > 0
    assert f["cache_size"]["kv_capacity_bytes"] > 0
    assert f["evictions"]["index"] == summed(c, "mooncake_conductor_evicted_blocks_total")
    moved = summed(c, "mooncake_conductor_kv_bytes_moved_total")
    assert f["bytes_moved"]["total"] == moved > 0
    # what the prefill workers say they sent is what the conductor counts as streamed
    sent = sum(link["bytes"] for link in snap["links"] if link["target"] == "decode")
    assert sent == f["bytes_moved"]["by_path"]["stream"] > 0
    into_decode = [link for link in snap["links"] if link["target"] == "decode-0"]
    assert into_decode[0]["bytes"] == sent
    slo = snap["slo"]
    assert slo["requests"] == 2 and slo["admitted_ratio"] == 1.0
    assert slo["ttft"]["count"] == 2 and slo["ttft"]["bound_s"] == 60.0
    assert slo["ttft"]["attained_ratio"] == 1.0
    assert slo["tbt"]["bound_s"] == 2.5 and slo["tbt"]["count"] > 0
    decode_loads = [i for i in cluster.instances() if i["role"] == "decode"]
    assert snap["preemptions"]["total"] == sum(i["load"]["preemptions"] for i in decode_loads)


def test_once_json_reads_a_store_masters_metrics(cluster: LiveCluster, store: Proc) -> None:
    snap = once_json(cluster.url, "--store-metrics", store.ready["metrics"])
    s = samples(jsonhttp.call(store.ready["metrics"]).body["text"])
    (master,) = snap["stores"]
    assert master["error"] is None and master["objects"] == 1
    assert snap["figures"]["cache_size"]["store_capacity_bytes"] == \
        summed(s, "mooncake_store_capacity_bytes") > 0
    assert snap["figures"]["evictions"]["store"] == summed(s, "mooncake_store_evictions_total")


def test_json_alone_streams_one_snapshot_per_refresh_with_rates(cluster: LiveCluster) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_cli", "--json", "top",
                             "--conductor", cluster.url, "--interval", "0.2"],
                            stdout=subprocess.PIPE, cwd=REPO, env=child_env())
    try:
        first, second = read_line(proc, 60), read_line(proc, 60)
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        assert proc.stdout is not None
        proc.stdout.close()
    assert rc == 0 and second["at"] > first["at"]
    assert first["figures"]["bytes_moved"]["rate_per_s"] is None  # nothing to compare with
    assert second["figures"]["bytes_moved"]["rate_per_s"] == 0  # an idle cluster
    assert {link["rate_per_s"] for link in second["links"]} == {0}


def test_bad_input_is_one_error_line(cluster: LiveCluster) -> None:
    for args, code, words in ((["--conductor", "ftp://x", "--once"], 2, "not an http"),
                              (["--conductor", cluster.url, "--interval", "0"], 2, "positive"),
                              (["--conductor", "127.0.0.1:1", "--once"], 6, "cannot reach"),
                              (["--conductor", cluster.url], 2, "needs a terminal")):
        done = top(*args)
        assert done.returncode == code, (args, done.stderr)
        assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    worker = cluster.instances()[0]["url"]  # a worker, not a conductor: refused, said so
    done = top("--conductor", worker, "--once")
    assert done.returncode == 2 and "is this a mooncake conductor" in done.stderr


def test_a_conductor_with_an_api_key_is_read_with_that_key() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_cli", "--json", "conductor",
                             "start", "--model", "smollm2-135m", "--port", "0", "--api-key",
                             "k-top"], stdout=subprocess.PIPE, cwd=REPO, env=child_env())
    try:
        url = read_line(proc, 120)["url"]
        refused = top("--conductor", url, "--once")
        assert refused.returncode == 2 and "--api-key" in refused.stderr, refused.stderr
        snap = once_json(url, "--api-key", "k-top")
        assert snap["conductor"] == url and snap["instances"] == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert proc.stdout is not None
        proc.stdout.close()


class Tmux:
    """A tmux server of its own (socket name) running one command in a 200x60 window."""

    def __init__(self, command: str, tmp: str) -> None:
        self.sock = f"mooncake-top-{uuid.uuid4().hex[:8]}"
        conf = os.path.join(tmp, "tmux.conf")
        with open(conf, "w") as fh:
            fh.write("set -g remain-on-exit on\n")  # keep the pane to read its exit line
        self.run("-f", conf, "new-session", "-d", "-s", "top", "-x", "200", "-y", "60",
                 "-c", str(REPO), command)

    def run(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True,
                              env=child_env(), timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def screen(self, history: bool = False) -> str:
        return self.run("capture-pane", "-p", "-t", "top", *(("-S", "-") if history else ()))

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True,
                       timeout=30)


def test_live_view_under_tmux_shows_the_cluster_refreshes_and_quits_on_q(
        cluster: LiveCluster, tmp_path: Any) -> None:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is missing: run ./scripts/setup.sh")
    ratio = once_json(cluster.url)["figures"]["prefix_hit_ratio"]
    cmd = f"{sys.executable} -m mooncake_cli top --conductor {cluster.url} --interval 0.5; " \
          "echo top-exited-$?"
    tmux = Tmux(cmd, str(tmp_path))
    try:
        def showing() -> bool:
            s = tmux.screen()
            return all(n in s for n in NAMES) and all(f in s for f in FIGURES) and \
                f"{100 * ratio:.1f}%" in s

        wait_for(showing, 120, 0.2, "the live view showing every instance and figure")
        first = tmux.screen()
        stamp = re.compile(r"at (\d\d:\d\d:\d\d)")
        assert first.count("mooncake top ") == 1 and stamp.search(first), first
        wait_for(lambda: (m := stamp.search(tmux.screen())) is not None and
                 m.group(1) != stamp.search(first).group(1),  # type: ignore[union-attr]
                 30, 0.2, "a refresh")
        again = tmux.screen()
        assert again.count("mooncake top ") == 1, again  # redrawn in place, not appended
        tmux.run("send-keys", "-t", "top", "q")
        wait_for(lambda: "top-exited-0" in tmux.screen(history=True), 30, 0.1,
                 "top to quit on q")
    finally:
        tmux.close()
