"""The benchmark plots are what BENCHMARKS.md's tables say.

Each plot under docs/img/ is drawn by docs/plots/bench_ratios.py from the table under its
marker in BENCHMARKS.md (regenerate: ``python docs/plots/bench_ratios.py``). These tests redraw
every plot and compare it with the committed file byte for byte, read each plot's markers back
as XML and compare them with the table's numbers, and hold every question of BENCHMARKS.md to
at least one plot.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_ratios", REPO / "docs" / "plots" / "bench_ratios.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_ratios"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


br = _script()
TEXT = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8")
SVG = "{http://www.w3.org/2000/svg}"


def test_every_committed_plot_is_what_its_table_draws() -> None:
    for plot in br.plots(TEXT):
        committed = (REPO / plot.path).read_text(encoding="utf-8")
        assert committed == br.render(plot), (
            f"{plot.path} is stale: python docs/plots/bench_ratios.py"
        )
    assert br.main(["--check"]) == 0


def test_no_bench_plot_is_left_without_its_table() -> None:
    declared = {plot.path for plot in br.plots(TEXT)}
    on_disk = {p.relative_to(REPO).as_posix() for p in (REPO / "docs" / "img").glob("bench-*.svg")}
    assert on_disk == declared


def test_each_plot_marks_the_median_and_min_of_every_row_of_its_table() -> None:
    for plot in br.plots(TEXT):
        root = ET.parse(REPO / plot.path).getroot()
        medians = [
            float(e.get("data-median", "nan"))
            for e in root.iter(f"{SVG}rect")
            if e.get("data-median")
        ]
        minima = [
            float(e.get("data-min", "nan")) for e in root.iter(f"{SVG}rect") if e.get("data-min")
        ]
        assert medians == [r.median for r in plot.rows], plot.path
        assert minima == [r.minimum for r in plot.rows if r.minimum is not None], plot.path


def test_every_question_of_benchmarks_md_has_a_plot() -> None:
    sections = re.split(r"^## ", TEXT, flags=re.MULTILINE)[1:]
    assert len(sections) == 4
    for section in sections:
        assert "<!-- plot: " in section, section.splitlines()[0]
        assert section.splitlines()[0].endswith("?"), section.splitlines()[0]


def test_a_plot_marker_without_a_table_is_refused_naming_the_line() -> None:
    with pytest.raises(
        br.PlotError, match=r"BENCHMARKS.md:2: a plot marker must stand directly above its table"
    ):
        br.plots("text\n<!-- plot: docs/img/x.svg | caption -->\n\nno table here\n")
    with pytest.raises(br.PlotError, match=r"'fast' is not a ratio"):
        br.plots(
            "<!-- plot: docs/img/x.svg | c -->\n| row | median | min |\n|---|---|---|\n| a | fast | 1 |\n"
        )
