"""`mooncake bench chaos --serving` with tiny values: real processes (a store master, the
conductor, a prefill and two decode workers of smollm2-135m), a decode worker killed with SIGKILL
under four greedy streams. Every stream's text must equal the clean run's, and the report must
carry the migration and write-behind figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mooncake_cli.commands.bench_plot import FIGURES
from mooncake_cli.interfaces import ConfigError
from tests.helpers.procs import child_env
from tests.helpers.smollm import NAME
from tests.helpers.store_procs import REPO

pytestmark = pytest.mark.timeout(2400)
STREAMS = 4


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mooncake_cli", "--json", "bench", "chaos",
                           "--serving", *args], capture_output=True, text=True, cwd=REPO,
                          env=child_env(), timeout=2300)


def test_every_stream_survives_a_killed_decode_worker(tmp_path: Path) -> None:
    png = tmp_path / "chaos-serving.png"
    run = bench("--model", NAME, "--streams", str(STREAMS), "--decode", "2", "--kill-every",
                "1", "--max-tokens", "128", "--plot", str(png))
    assert run.returncode == 0, run.stderr[-3000:]
    rep = json.loads(run.stdout)
    assert rep["model"] == NAME
    assert rep["config"]["streams"] == STREAMS and rep["config"]["decode"] == 2
    clean, chaos, wb = rep["clean"], rep["chaos"], rep["write_behind"]
    assert clean["errors"] == 0 and clean["tokens"] == STREAMS * 128, clean
    assert chaos["kills"], "no decode worker was killed"
    assert all(k["running"] >= 1 and k["name"].startswith("decode-") for k in chaos["kills"])
    # every stream whole and the same as without kills
    assert chaos["failures"] == [] and chaos["conductor_errors"] == []
    assert (chaos["identical"], chaos["errors"], chaos["differs"]) == (STREAMS, 0, 0), chaos
    assert chaos["tokens"] == STREAMS * 128
    assert chaos["migrations"] >= 1 and chaos["moved_streams"] >= 1
    assert chaos["conductor_migration_gap"]["count"] == chaos["migrations"]
    assert chaos["added_latency"]["streams"] == chaos["moved_streams"]
    assert chaos["added_latency"]["p50_s"] is not None
    assert chaos["migration_placement"]["queue_wait_p50_s"] is not None
    # a moved stream's prompt (and what the dead worker wrote behind) came from the store
    assert chaos["reused_blocks_per_migration"] > 0
    assert chaos["reused_tokens"] + chaos["recomputed_tokens"] > 0
    # the same prompts with and without write-behind: the same texts, blocks stored when on
    assert wb["same_text"] == STREAMS
    assert wb["off"]["errors"] == 0 and wb["on"]["errors"] == 0
    assert wb["on"]["stored_blocks"] > 0 and wb["off"]["decode_tokens_per_s"] > 0
    assert wb["on"]["runs"] == wb["off"]["runs"] == 2  # on, off, off, on
    assert wb["off"]["stored_blocks"] == 0
    assert wb["ratio"] == pytest.approx(wb["on"]["decode_tokens_per_s"] /
                                        wb["off"]["decode_tokens_per_s"])
    assert len(chaos["added_latency"]["samples_s"]) == chaos["added_latency"]["streams"]
    assert rep["plot"] == str(png) and png.stat().st_size > 0
    fig = FIGURES["chaos-serving"](rep)
    assert [ax.get_title() for ax in fig.axes][:2] == [
        "outcomes against the clean run", "added latency of a migrated stream"]
    for side in ("on", "off"):  # CPU time read off /proc for every process of the cluster
        assert wb[side]["cluster_cpu_s"] > wb[side]["decode_cpu_s"] > 0
    assert wb["cpu_ratio"] == pytest.approx(wb["on"]["tokens_per_cpu_s"] /
                                            wb["off"]["tokens_per_cpu_s"])


@pytest.mark.parametrize("args, message", [
    (["--decode", "1"], "--decode must be >= 2"),
    (["--kill-every", "0"], "--kill-every must be > 0"),
    (["--kills", "3"], "--kills does not apply to --serving"),
])
def test_bad_options_get_one_error_line(args: list[str], message: str) -> None:
    run = bench(*args)
    assert run.returncode != 0
    assert message in run.stderr and "Traceback" not in run.stderr


def test_serving_options_need_serving() -> None:
    from mooncake_cli.commands.bench_chaos_serving import only_with_serving

    with pytest.raises(ConfigError, match="--streams needs --serving"):
        only_with_serving(model=None, streams=4)
    only_with_serving(model=None, streams=None)
