"""monitoring/: every metric the Grafana dashboard queries is served by a live cluster (a
`conductor start --local 1,1` of the real model, its workers, and a store master with its
metrics port and one node), with the label values the queries match on; every query is valid
PromQL; the Prometheus scrape config has a job for every role, each serving its metrics."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from mooncake_cli.http import jsonhttp
from tests.helpers.live_cluster import LiveCluster
from tests.helpers.store_procs import Proc, start_master, start_node

pytestmark = pytest.mark.timeout(900)
MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
DASHBOARD = MONITORING / "grafana" / "mooncake.json"
PROMETHEUS = MONITORING / "prometheus.yml"
JOB_PREFIX = {"mooncake-conductor": "mooncake_conductor_", "mooncake-prefill": "mooncake_worker_",
              "mooncake-decode": "mooncake_worker_", "mooncake-store-master": "mooncake_store_"}
# what the issue asks the dashboard to show, by words a panel's title carries
TOPICS = ("hit ratio", "cache size", "evictions", "bytes moved between nodes", "ttft", "tbt",
          "queue", "kv use", "bytes moved per link", "preemptions", "slo")
Series = list[dict[str, str]]  # the label sets of one sample name's series


@pytest.fixture(scope="module")
def scrapes() -> Iterator[dict[str, str]]:
    """Role -> the /metrics text of its live endpoint (after one answered request)."""
    cluster = LiveCluster("1,1")
    master = start_master(0, "--metrics-port", "0")
    node: Proc | None = None
    try:
        node = start_node(master.ready["address"])
        assert node.ask(cmd="put", key="dash-k", size=4096, seed=1, replicas=1)["ok"]
        assert node.ask(cmd="get", key="dash-k", size=4096, seed=1)["match"]
        cluster.complete("Mooncake keeps the KV cache of every prompt it has seen in a store")
        texts = {"conductor": cluster.url + "/metrics", "store": master.ready["metrics"]}
        for inst in cluster.instances():
            texts[inst["role"]] = inst["url"] + "/metrics"
        yield {role: jsonhttp.call(url).body["text"] for role, url in texts.items()}
    finally:
        if node is not None:
            node.stop()
        master.stop()
        cluster.stop()


def series(texts: dict[str, str]) -> dict[str, Series]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Series] = {}
    for text in texts.values():
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, []).append(dict(s.labels))
    return out


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text(encoding="utf-8")))


def queries(dash: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every query, once per value of the custom variables it uses,
    with Grafana's $__rate_interval as a plain range."""
    variables = {v["name"]: [o["value"] for o in v["options"]]
                 for v in dash["templating"]["list"] if v["type"] == "custom"}
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "1m")
            used = [n for n in variables if f"${n}" in expr]
            for values in itertools.product(*(variables[n] for n in used)):
                text = expr
                for name, value in zip(used, values, strict=True):
                    text = text.replace(f"${name}", value)
                yield panel["title"], text


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """(metric name, equality matchers) of every vector selector of a PromQL expression;
    ValueError when it is not valid PromQL."""
    found: list[tuple[str, dict[str, str]]] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            equal = {m.name: m.value for m in node.matchers.matchers
                     if m.op == promql_parser.MatchOp.Equal}
            found.append((node.name or equal.pop("__name__", ""), equal))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def test_every_dashboard_query_is_valid_promql_over_live_metric_names(
        scrapes: dict[str, str]) -> None:
    live = series(scrapes)
    checked, missing = set(), []
    for title, expr in queries(dashboard()):
        for name, labels in selectors(expr):
            checked.add(name)
            if not any(all(s.get(k) == v for k, v in labels.items())
                       for s in live.get(name, [])):
                missing.append(f"{title}: {name}{labels or ''}")
    assert not missing, "queried but not served by the live cluster:\n" + "\n".join(missing)
    # every role's metrics are on the dashboard
    assert {n.split("_")[1] for n in checked} == {"conductor", "worker", "store"}


def test_the_dashboard_shows_what_an_operator_needs() -> None:
    dash = dashboard()
    titles = " | ".join(p["title"].lower() for p in dash["panels"])
    assert [t for t in TOPICS if t not in titles] == []
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]
        assert panel["type"] == "row" or refs, panel["title"]


def test_the_scrape_config_has_a_job_for_every_role_serving_its_metrics(
        scrapes: dict[str, str]) -> None:
    config = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == set(JOB_PREFIX)
    role_of = {"mooncake-conductor": "conductor", "mooncake-prefill": "prefill",
               "mooncake-decode": "decode", "mooncake-store-master": "store"}
    for name, job in jobs.items():
        assert job.get("metrics_path", "/metrics") == "/metrics"
        assert job.get("scheme", "http") == "http"
        assert job["static_configs"][0]["targets"], name
        text = scrapes[role_of[name]]
        assert f"\n{JOB_PREFIX[name]}" in "\n" + text, name
    worker_roles = {labels.get("role") for name, sets in series(
        {r: scrapes[r] for r in ("prefill", "decode")}).items() for labels in sets}
    assert {"prefill", "decode"} <= worker_roles
