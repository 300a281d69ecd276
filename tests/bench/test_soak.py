"""The soak bench: its growth verdict (the slope per hour, its standard error) and its main path on a small stack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak import report, slope_per_hour

ROOT = Path(__file__).resolve().parents[2]


def test_slope_per_hour_and_its_standard_error():
    times = [0.0, 60.0, 120.0, 180.0]
    assert slope_per_hour(times, [10.0, 11.0, 12.0, 13.0]) == pytest.approx((60.0, 0.0))
    slope, se = slope_per_hour(times, [10.0, 12.0, 10.0, 12.0])  # alternating noise: a small slope, a large error
    assert slope == pytest.approx(24.0) and se == pytest.approx(33.94, rel=1e-3)
    assert slope_per_hour(times[:2], [1.0, 2.0]) != slope_per_hour(times[:2], [1.0, 2.0])  # too few points: NaN


def test_a_series_grows_only_past_its_noise_and_the_tolerance_and_after_the_settling_time():
    samples = [{"t": 60.0 * i, "leak": 100.0 + 10 * i, "flat": 50.0 + (i % 2), "start_up": 10.0 if i else 500.0,
                "creep": 1000.0 + 0.01 * i} for i in range(10)]
    series = report(samples, settle=60.0, tolerance=0.05)
    assert series["leak"]["grows"] and series["leak"]["slope_per_hour"] == pytest.approx(600.0)
    assert not series["flat"]["grows"]
    assert series["start_up"]["first"] == 10.0 and not series["start_up"]["grows"]  # the first sample is before settle
    assert not series["creep"]["grows"]  # steady but under 5% of its mean per hour


@pytest.mark.slow
def test_a_short_soak_of_calc_writes_its_report(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench.soak", "--duration", "6", "--sample-every", "2", "--settle",
                           "0", "--concurrency", "1", "--families", "calc", "--idle-timeout", "2", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "report.json").read_text())
    assert summary["families"] == ["calc"] and summary["interacts"] > 0 and summary["failed_sessions"] == 0
    assert {"controller/rss_mib", "worker0.0-calc/open_files", "interacts_per_s"} <= set(summary["series"])
    assert "| controller/rss_mib |" in (tmp_path / "report.md").read_text()
    assert done.stdout.strip().splitlines()[-1].startswith("growing series:")
    # An earlier run's samples fitted again from a later point: the same samples, fewer of them fitted.
    again = subprocess.run([sys.executable, "-m", "bench.soak", "--reanalyse", str(tmp_path / "report.json"),
                            "--settle", "4", "--out", str(tmp_path / "again")], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 0, again.stderr[-3000:]
    refit = json.loads((tmp_path / "again" / "report.json").read_text())
    assert refit["samples"] == summary["samples"] and refit["samples_fitted"] < summary["samples_fitted"]
