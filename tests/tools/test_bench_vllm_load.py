"""The vLLM bench row's arithmetic (the engine starts themselves run only in the vLLM venv, by
hand: BENCHMARKS.md)."""

from __future__ import annotations

from benchmarks.vllm_load import summary


def test_the_summary_gives_each_loaders_min_and_median_and_the_ratio_of_medians() -> None:
    rows = summary({
        "auto": [(2.0, 9.0, 10.0), (1.0, 5.0, 30.0), (4.0, 7.0, 20.0)],
        "specbind": [(0.5, 6.0, 1.0), (0.25, 4.0, 3.0), (3.0, 8.0, 2.0)],
    })  # fmt: skip
    assert rows[0].startswith("auto ") and "median 2.000 s (min 1.000)" in rows[0]
    assert "LLM(...): median 7.000 s (min 5.000)" in rows[0] and "median 20 (3 starts)" in rows[0]
    assert "median 0.500 s (min 0.250)" in rows[1] and "median 6.000 s (min 4.000)" in rows[1]
    assert rows[2] == "specbind / auto, medians: load_weights 0.25, LLM(...) 0.86"


def test_a_loader_with_no_start_gives_no_row_and_no_ratio() -> None:
    assert summary({"auto": [], "specbind": []}) == []


def test_the_peak_rss_is_this_address_spaces_own_not_one_inherited_across_exec() -> None:
    """A child forked from a process holding 256 MiB and exec'd reports its own peak, far
    below what the forking process held (ru_maxrss would report at least that)."""
    import subprocess
    import sys

    import numpy as np

    held = np.ones(256 << 20, np.uint8)  # resident in this process when it forks
    code = "from benchmarks.vllm_load import peak_rss_kib; print(peak_rss_kib())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 0 < int(out.stdout) < 200 << 10  # KiB: well under the 256 MiB held at the fork
    assert held.all()
