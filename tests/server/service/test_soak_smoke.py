"""benchmarks/soak.py in a small mode: it runs, every request is answered or refused as it should
be, its JSON has what programs read. No timing and no growth is asserted here (two rounds are no
trend; the soak figures are in docs/performance.md); the trend's arithmetic is checked on made-up
samples."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.support import REPO

SOAK = REPO / "benchmarks" / "soak.py"


@pytest.mark.slow
def test_two_rounds_answer_every_request_as_expected(tmp_path):
    out = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, str(SOAK), "--rounds", "2", "--seq", "2", "--clients", "2", "--settle", "0.2",
                          "--dir", str(tmp_path), "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"machine", "rounds", "wall_s", "counts", "refused_by_code", "outcomes", "unexpected", "server", "samples",
            "trend", "verdict", "failed"} <= report.keys()
    assert report["counts"]["unexpected"] == 0 and report["unexpected"] == [] and not report["failed"]
    assert report["server"] == {"died": False, "exit_code": 0}
    assert report["rounds"] == 2 and [s["round"] for s in report["samples"]] == [0, 1, 2]
    assert {"rss_mib", "fds", "threads", "requests"} <= report["samples"][-1].keys()
    assert set(report["trend"]) == {"rss_mib", "anon_mib", "fds", "threads"}
    # every kind of request ran, and each ended the one way it should
    outcomes = report["outcomes"]
    assert outcomes["init_sequential"] == {"ok": 4} and outcomes["init_concurrent"] == {"ok": 8}
    assert outcomes["stream_cancelled"] == {"CANCELLED": 2}
    assert outcomes["file_index_past_end"] == {"OUT_OF_RANGE": 2}
    assert set(outcomes["client_killed_mid_stream"]) <= {"KILLED", "finished before the kill"}
    for kind in ("bad_preset", "bad_model_type", "bad_dtype", "bad_seed (client-side)", "over_max_params",
                 "bad_shard_size", "bad_policy", "bad_tensor_name", "bad_page_size", "malformed_bytes"):
        assert outcomes[kind] == {"INVALID_ARGUMENT": 2}, kind
    assert sum(report["counts"][k] for k in ("ok", "refused_or_cut", "unexpected")) == report["counts"]["requests"]


def load_soak():
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_trend_tells_noise_from_growth():
    soak = load_soak()
    noise = [0.0, 0.3, -0.2, 0.1, -0.3, 0.2, 0.0, -0.1, 0.3, -0.2, 0.1, 0.0]
    flat = [{"requests": 30 * i, "rss_mib": 400 + e} for i, e in enumerate(noise)]
    ramp = [{"requests": 30 * i, "rss_mib": 400 + e + 0.5 * i} for i, e in enumerate(noise)]
    assert soak.trend(flat, "rss_mib", 3, 0.004)["verdict"] == "no growth beyond noise"
    grown = soak.trend(ramp, "rss_mib", 3, 0.004)
    assert grown["verdict"] == "growth beyond noise"
    assert abs(grown["slope_per_1k_requests"] - 0.5 / 30 * 1000) < 2  # the ramp's own slope, give or take the noise
    # a count that never moves passes; one more fd at the end is one unit, within the threshold
    steady = [{"requests": i, "fds": 13} for i in range(10)]
    assert soak.trend(steady, "fds", 3, 1)["verdict"] == "no growth beyond noise"
    assert soak.trend(steady[:-1] + [{"requests": 9, "fds": 14}], "fds", 3, 1)["verdict"] == "no growth beyond noise"
    assert soak.trend(steady[:3], "fds", 3, 1)["verdict"] == "too few samples"


def test_a_slow_climb_under_the_threshold_is_still_rising():
    """Two noise SDs over the half, below the 3-SD threshold, but steady over 40 samples: the
    verdict that once let it pass now names it; the same noise without the climb passes."""
    soak = load_soak()
    noise = [0.3, -0.3, 0.1, -0.1, 0.2, -0.2, 0.0, 0.3, -0.3, 0.1] * 4
    sd = 1.4826 * 0.2  # the MAD of this noise is 0.2
    climb = 2 * sd / 20  # per sample: 2 SDs over the 20 samples of the second half
    slow = [{"requests": 10 * i, "rss_mib": 700 + e + climb * i} for i, e in enumerate(noise)]
    flat = [{"requests": 10 * i, "rss_mib": 700 + e} for i, e in enumerate(noise)]
    verdict = soak.trend(slow, "rss_mib", 3, 0.004)
    assert verdict["growth_over_half"] < verdict["threshold"]  # under the growth threshold alone
    assert verdict["verdict"] == "still rising" and verdict["slope_t"] > 3
    assert soak.trend(flat, "rss_mib", 3, 0.004)["verdict"] == "no growth beyond noise"
