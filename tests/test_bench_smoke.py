"""`specbind bench` runs end to end (tiny geometry): the baseline's outputs agree with
specbind's and every figure is reported. Speed itself is read from BENCHMARKS.md, not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


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


def test_bench_keeps_its_cache_in_the_user_cache_directory_not_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from runtime import bench
    from runtime.cli import main

    seen: list[Path] = []
    monkeypatch.setattr(
        bench, "run", lambda table, tps, repeat, cache, *a, **k: seen.append(cache) or {}
    )
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert main(["bench", "--json"]) == 0
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/is/ignored")
    assert main(["bench", "--json"]) == 0
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert main(["bench", "--json"]) == 0
    assert main(["bench", "--json", "--cache", str(tmp_path / "given")]) == 0
    assert seen == [
        tmp_path / "xdg" / "specbind" / "bench",
        tmp_path / "home" / ".cache" / "specbind" / "bench",
        tmp_path / "home" / ".cache" / "specbind" / "bench",
        tmp_path / "given",
    ]
    assert main(["bench", "--cache", ""]) == 2
    assert "--cache '': an empty path" in capsys.readouterr().err
