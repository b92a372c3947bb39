"""What `mooncake top` reads from a running cluster, all at once: the conductor's instance list
and /metrics, each instance's /metrics (where reachable) and any store master's /metrics.

    scrape = gather(Sources("http://127.0.0.1:8000", api_key=""))
    scrape.listing["instances"]           # GET /v1/instances as the conductor answers it
    total(scrape.conductor, "mooncake_conductor_kv_bytes_moved_total", path="stream")

The conductor must answer (else OSError, or ConfigError for a refused API key); an instance or
store master that does not is kept with its error, and the view says so.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from mooncake_cli.http import jsonhttp
from mooncake_cli.interfaces import ConfigError, MooncakeError

# sample name -> (labels, value) of each of its samples
Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Samples:
    """The samples of a Prometheus text exposition; ValueError when it is malformed."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def total(samples: Samples | None, metric: str, /, **labels: str) -> float | None:
    """The sum of sample `metric` over the series whose labels include `labels`; None when
    there is no such series (or no samples at all)."""
    if samples is None:
        return None
    found = [v for lab, v in samples.get(metric, ()) if all(lab.get(k) == w
                                                          for k, w in labels.items())]
    return sum(found) if found else None


def base_url(url: str, what: str = "--conductor") -> str:
    """`url` as http://HOST:PORT (http:// added when missing, any path dropped); ConfigError
    for anything that is not one."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    try:
        host, port, _ = jsonhttp.split(url)
    except ValueError:
        raise ConfigError(f"{what} {url!r} is not an http://HOST:PORT URL") from None
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(frozen=True)
class Sources:
    """Where to look: the conductor, its OpenAI API key (when it has one) and store masters'
    metrics URLs (`mooncake store master --metrics-port`)."""

    conductor: str
    api_key: str = ""
    store_metrics: tuple[str, ...] = ()
    timeout: float = 3.0


@dataclass
class Endpoint:
    """One /metrics endpoint: its samples, or why it gave none."""

    url: str
    samples: Samples | None = None
    error: str | None = None


@dataclass
class Scrape:
    """Everything one round read, stamped with the wall-clock time it ended."""

    conductor_url: str
    listing: dict[str, Any]
    conductor: Samples
    instances: dict[str, Endpoint] = field(default_factory=dict)  # by instance name
    stores: list[Endpoint] = field(default_factory=list)
    at: float = 0.0


def _get(url: str, timeout: float, headers: dict[str, str] | None = None) -> jsonhttp.Reply:
    try:
        return jsonhttp.fetch(url, "GET", None, timeout, headers)
    except OSError as e:
        raise OSError(f"cannot reach {url}: {type(e).__name__}: {e}".rstrip(": ")) from None


def _endpoint(url: str, timeout: float) -> Endpoint:
    try:
        resp = _get(url, timeout)
        if resp.status != 200:
            return Endpoint(url, error=f"answered {resp.status}")
        return Endpoint(url, parse_metrics(resp.data.decode(errors="replace")))
    except (OSError, ValueError) as e:
        return Endpoint(url, error=str(e) or type(e).__name__)


def _listing(src: Sources, base: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {src.api_key}"} if src.api_key else None
    resp = _get(base + "/v1/instances", src.timeout, headers)
    try:
        body = json.loads(resp.data)
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if resp.status == 401 and isinstance(error, dict):
        if error.get("code") == "invalid_api_key":
            raise ConfigError(f"the conductor at {base} refused the instance list: give its "
                              "--api-key (or OPENAI_API_KEY)")
        raise ConfigError(f"{base}/v1/instances refused: {error.get('message')} (is this a "
                          "mooncake conductor?)")
    if resp.status != 200 or not isinstance(body, dict) or \
            not isinstance(body.get("instances"), list):
        raise MooncakeError(f"{base}/v1/instances answered {resp.status} without an "
                            "instance list: is this a mooncake conductor?")
    return body


def _conductor_metrics(base: str, timeout: float) -> Samples:
    resp = _get(base + "/metrics", timeout)
    if resp.status != 200:
        raise MooncakeError(f"{base}/metrics answered {resp.status}")
    try:
        return parse_metrics(resp.data.decode(errors="replace"))
    except ValueError as e:
        raise MooncakeError(f"{base}/metrics is not Prometheus text: {e}") from None


def gather(src: Sources) -> Scrape:
    """One round: the conductor's list and metrics first, then every instance's and store
    master's /metrics at once."""
    base = base_url(src.conductor)
    with ThreadPoolExecutor(max_workers=2) as pool:
        listing_f = pool.submit(_listing, src, base)
        metrics_f = pool.submit(_conductor_metrics, base, src.timeout)
        listing, conductor = listing_f.result(), metrics_f.result()
    urls = {str(i.get("name")): str(i.get("url", "")).rstrip("/") + "/metrics"
            for i in listing["instances"] if isinstance(i, dict)}
    stores = [base_url(u, "--store-metrics") + "/metrics" for u in src.store_metrics]
    wanted = [*urls.values(), *stores]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(wanted)))) as pool:
        got = list(pool.map(lambda u: _endpoint(u, src.timeout), wanted))
    return Scrape(base, listing, conductor, dict(zip(urls, got[:len(urls)], strict=True)),
                  got[len(urls):], time.time())
