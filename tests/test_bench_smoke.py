"""`specbind bench` runs end to end (tiny geometry): the baseline's outputs agree with
specbind's and every figure is reported. Speed itself is read from BENCHMARKS.md, not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_runs_and_reports_every_figure(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", "bench", "--tiny", "--repeat", "1", "--json",
         "--tp-size", "1", "--tp-size", "2", "--cache", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert [row["tp"] for row in r["rows"]] == [1, 2]
    for row in r["rows"]:
        for key in (
            "specbind_s",
            "baseline_s",
            "memcpy_s",
            "rss_specbind_mb",
            "rss_baseline_mb",
            "rss_memcpy_mb",
        ):
            assert row[key] > 0, key
        assert row["shard_bytes"] > 0
    assert [a["geometry"]["tp"] for a in r["absorb"]] == [1, 2]
    assert all(a["gflop"] > 0 and a["absorb_gflops"] > 0 for a in r["absorb"])
    assert r["generate_s"] > 0
