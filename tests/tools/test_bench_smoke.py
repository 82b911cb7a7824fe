"""`python -m benchmarks` (the lab's suite, from the clone) runs end to end (tiny geometry): the baseline's outputs agree with
specbind's and every figure is reported. Speed itself is read from BENCHMARKS.md, not asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import patience
import pytest

REPO = Path(__file__).resolve().parents[2]


def test_bench_runs_and_reports_every_figure(tmp_path: Path) -> None:
    proc = patience.run(
        [sys.executable, "-m", "benchmarks", "--tiny", "--quick", "--repeat", "1", "--json",
         "--tp-size", "1", "--tp-size", "2", "--no-rss", "--cache", str(tmp_path)],
        capture_output=True, text=True, cpu=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert [row["tp"] for row in r["rows"]] == [1, 2]
    assert [(row["tp"], row["ep"]) for row in r["moe_rows"]] == [(1, 1), (2, 1), (1, 2)]
    experts = r["moe_rows"][0]["experts"]
    assert [row["experts_on_rank"] for row in r["moe_rows"]] == [experts, experts, experts // 2]
    one, tp2, ep2 = (row["shard_bytes"] for row in r["moe_rows"])
    assert one > tp2 > 0 and one > ep2 > 0
    for row in r["rows"] + r["moe_rows"]:
        for key in ("specbind_s", "baseline_s", "memcpy_s", "specbind_min_s", "baseline_min_s"):
            assert row[key] > 0, key
        assert row["shard_bytes"] > 0
    assert all(row["copy_only_bytes"] > 0 for row in r["rows"])
    assert [a["geometry"]["tp"] for a in r["absorb"]] == [1, 2]
    assert all(a["gflop"] > 0 and a["absorb_gflops"] > 0 for a in r["absorb"])
    assert r["generate_s"] > 0
    assert [x["tp"] for x in r["process_rows"]] == [1, 2]
    assert all(x["specbind_min_s"] > 0 and x["baseline_min_s"] > 0 for x in r["process_rows"])
    fixed = r["fixed_cost"]
    assert fixed["specbind_min_s"] > 0 and fixed["floor_min_s"] > 0 and fixed["repeat"] == 1
    assert fixed["numpy_min_s"] > 0  # the floor's own floor, so a slow ml_dtypes shows
    assert r["quick"] is True
    assert all(x["bytes"] > 0 for x in r["process_rows"])  # both sides copied out these bytes
    whole = r["whole_rows"]  # every field of the slice, checked equal, then raced
    assert [(x["tp"], x["part"], x["fields"]) for x in whole] == [
        (1, "whole", 99),
        (2, "whole", 99),
    ]
    assert all(w["bytes"] > a["bytes"] for w, a in zip(whole, r["process_rows"], strict=True))
    assert all(x["specbind_min_s"] > 0 and x["baseline_min_s"] > 0 for x in whole)
    lim = r["limits"]
    assert [(x["tp"], x["ep"]) for x in lim["rank"]] == [(2, 2)]
    for x in [*lim["rank"], lim["out"]]:
        assert x["bytes"] > 0 and all(t["min_s"] > 0 for t in x["times"].values()), x
    assert set(lim["rank"][0]["times"]) == {"specbind", "memcpy"}
    assert set(lim["out"]["times"]) == {"out", "dd"} and lim["out"]["deterministic"] is True
    assert lim["planning"]["tensors"] > 10_000 and lim["planning"]["us_per_tensor_min"] > 0
    (runai,) = lim["runai"]
    if runai_installed():
        assert runai["times"]["runai_numpy"]["min_s"] > 0 and runai["streamed_bytes"] > 0
    else:
        assert "runai-model-streamer is not installed" in runai["skipped"]
    assert "runai row skipped" in proc.stderr or runai_installed()
    for step in (
        "whole slice tp 2,",
        "attention tp 2:",
        "rank tp 2 x ep 2",
        "--out tp 2 x ep 2 vs dd",
        "planning",
    ):
        assert f"]: {step}" in proc.stderr, step  # each slow step says what it does
    from benchmarks import main as bench

    text = bench.render(r)
    assert "| 1 | 2 | " in text  # the text table has the ep row
    assert "| tp 2 x ep 2 |" in text and "dd conv=fdatasync" in text
    assert "whole slice (every block, every field)" in text and "| 2 | off | 99 | " in text
    assert "| 2 | default (" in text  # the machine's THP setting beside huge pages off


def runai_installed() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) for m in ("runai_model_streamer", "torch"))


def test_quick_binds_the_tiny_slice_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import main as bench
    from benchmarks.cli import main

    seen: list[bool] = []
    monkeypatch.setattr(
        bench, "run", lambda table, tps, repeat, cache, tiny, **k: seen.append(tiny) or {}
    )
    assert main(["--json", "--quick"]) == 0
    assert main(["--json"]) == 0
    assert seen == [True, False]
    assert "--quick binds the tiny slice" in capsys.readouterr().err


def test_whole_process_rows_run_at_least_five_rounds_unless_quick() -> None:
    from benchmarks import main as bench

    assert [bench.process_repeats(n) for n in (1, 3, 5, 9)] == [5, 5, 5, 9]
    assert bench.process_repeats(9, quick=True) == 1


def test_bench_measures_peak_rss_of_each_method_in_its_own_process(tmp_path: Path) -> None:
    # Apart from the run above, at one size, to stay quick: a baseline child imports torch (~3 s).
    from benchmarks import main as bench
    from specbind.generated import MODELS

    table = MODELS["glm-5.3-flash"]
    ckpt, _ = bench.ensure_checkpoint(table, tmp_path, tiny=True)
    rows: list[dict[str, object]] = [{"part": "experts", "tp": 1, "ep": 2}]
    bench.add_rss(ckpt, rows)
    for k in bench.METHODS:
        assert isinstance(rows[0][f"rss_{k}_mb"], float) and rows[0][f"rss_{k}_mb"] > 0


def test_bench_takes_its_blocks_from_the_slots_and_writes_the_fewest_layers() -> None:
    from benchmarks import main as bench
    from specbind.generated import MODELS

    table = MODELS["glm-5.3-flash"]
    parts = bench.parts(table)
    assert parts == {"attention": {"dsa", "kda"}, "experts": {"moe"}}
    assert bench.copy_only(table, parts["attention"]) == {"kda"}  # dsa computes its absorbs
    assert bench.computed_fields(table, parts["experts"]) == set()  # MoE: byte for byte
    assert bench.slice_layers(table) == 4  # KDA + dense at 0, DSA + MoE first at 3
    assert bench.slice_values(table, False, bench.DEFAULT_SETS)["experts"] == 32
    assert bench.slice_values(table, True, {"experts": 8})["experts"] == 8


def test_bench_keeps_its_cache_in_the_user_cache_directory_not_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import main as bench
    from benchmarks.cli import main

    seen: list[Path] = []
    monkeypatch.setattr(
        bench, "run", lambda table, tps, repeat, cache, *a, **k: seen.append(cache) or {}
    )
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert main(["--json"]) == 0
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/is/ignored")
    assert main(["--json"]) == 0
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert main(["--json"]) == 0
    assert main(["--json", "--cache", str(tmp_path / "given")]) == 0
    assert seen == [
        tmp_path / "xdg" / "specbind" / "bench",
        tmp_path / "home" / ".cache" / "specbind" / "bench",
        tmp_path / "home" / ".cache" / "specbind" / "bench",
        tmp_path / "given",
    ]
    assert main(["--cache", ""]) == 2
    assert "--cache '': an empty path" in capsys.readouterr().err
