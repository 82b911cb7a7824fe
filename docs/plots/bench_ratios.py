"""The ratio plots of BENCHMARKS.md, drawn from its own tables with ``specbind.svg``.

``python docs/plots/bench_ratios.py`` writes every plot; ``--check`` writes nothing and exits 1
naming each plot that differs from what its table draws (``tests/tools/test_docs_plots.py``).
A plot is declared by a line ``<!-- plot: PATH | AXIS CAPTION -->`` directly above a Markdown
table whose first column names the row and which has a ``median`` and a ``min`` column (ratios;
an empty ``min`` cell is a row recorded as a median only). One row of the plot per table row: a
square at the median, a diamond at the ratio of minima, on a linear axis from 0 that always
shows 1 (parity, or the limit), drawn as a line.
Invariants: the table is the only source of a plot's numbers (each marker carries its value in
``data-median`` / ``data-min``); the output depends on nothing but the table (no date, no
randomness), so a committed plot is compared byte for byte. No plotting library: the project's
own SVG writer escapes every label.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # docs/plots/x.py -> the repository root
if str(ROOT) not in sys.path:  # run as a script from anywhere: this clone's specbind
    sys.path.insert(0, str(ROOT))

from specbind.svg import Svg  # noqa: E402  (after the path above)

SOURCE = ROOT / "BENCHMARKS.md"
_PLOT = re.compile(r"^<!-- plot: (\S+\.svg) \| (.+) -->$")

WIDTH, LABEL_W, RIGHT, ROW_H, TOP = 760, 330, 30, 22, 58
MEDIAN, MINIMUM = "#1f5fa8", "#e07b00"


@dataclass(frozen=True)
class Row:
    label: str
    median: float
    minimum: float | None


@dataclass(frozen=True)
class Plot:
    path: str
    caption: str
    rows: tuple[Row, ...]


class PlotError(ValueError):
    """A plot marker without a table the plot can be drawn from."""


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _number(cell: str, where: str) -> float:
    try:
        return float(cell)
    except ValueError:
        raise PlotError(f"{where}: {cell!r} is not a ratio") from None


def plots(text: str, source: str = "BENCHMARKS.md") -> list[Plot]:
    """Every plot ``text`` declares, with the rows of the table under its marker."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = _PLOT.match(line.strip())
        if not m:
            continue
        where = f"{source}:{i + 1}"
        if i + 2 >= len(lines) or not lines[i + 1].startswith("|"):
            raise PlotError(f"{where}: a plot marker must stand directly above its table")
        head = _cells(lines[i + 1])
        if "median" not in head or "min" not in head:
            raise PlotError(f"{where}: the table has no 'median' and 'min' columns: {head}")
        med, low = head.index("median"), head.index("min")
        rows = []
        for j in range(i + 3, len(lines)):
            if not lines[j].startswith("|"):
                break
            cells = _cells(lines[j])
            at = f"{source}:{j + 1}"
            rows.append(
                Row(
                    label=cells[0].replace("`", ""),
                    median=_number(cells[med], at),
                    minimum=_number(cells[low], at) if cells[low] else None,
                )
            )
        if not rows:
            raise PlotError(f"{where}: the table under the plot marker has no rows")
        out.append(Plot(m[1], m[2], tuple(rows)))
    return out


def _diamond(svg: Svg, x: float, y: float, value: float) -> None:
    # A square turned 45 degrees about its centre: specbind.svg draws rectangles only.
    svg.box(
        x - 4, y - 4, 8, 8, MINIMUM, tip=f"min {value:g}",
        transform=f"rotate(45 {x:.2f} {y:.2f})", data_min=f"{value:g}",
    )  # fmt: skip


def render(plot: Plot) -> str:
    """The SVG of one plot."""
    values = [v for r in plot.rows for v in (r.median, r.minimum) if v is not None]
    top = max(1.25, math.ceil(max(values) * 4 + 0.5) / 4)  # quarter steps, past every value
    height = TOP + ROW_H * len(plot.rows) + 34
    axis_w = WIDTH - LABEL_W - RIGHT
    svg = Svg(WIDTH, height, plot.caption)

    def x_of(v: float) -> float:
        return LABEL_W + axis_w * v / top

    svg.label(8, 18, plot.caption, size=13, font_weight="bold")
    svg.box(8, 28, 10, 10, MEDIAN)
    svg.label(24, 37, "median", size=11)
    svg.box(84, 29, 8, 8, MINIMUM, transform="rotate(45 88 33)")
    svg.label(100, 37, "min (ratio of the minima)", size=11)
    bottom = TOP + ROW_H * len(plot.rows)
    step = 0.25 if top <= 2 else 0.5
    for k in range(int(top / step) + 1):
        v = k * step
        svg.line(x_of(v), TOP - 6, x_of(v), bottom, "#e4e4e4" if v != 1 else "#555555")
        svg.label(x_of(v), bottom + 16, f"{v:g}", size=11, text_anchor="middle")
    for n, row in enumerate(plot.rows):
        y = TOP + ROW_H * n + ROW_H / 2
        svg.group(tip=f"{row.label}: median {row.median:g}, min {row.minimum}")
        label = row.label if len(row.label) <= 52 else row.label[:51] + "…"  # fits LABEL_W
        svg.label(LABEL_W - 8, y + 4, label, size=11, text_anchor="end")
        svg.line(LABEL_W, y, WIDTH - RIGHT, y, "#f0f0f0")
        svg.box(
            x_of(row.median) - 5, y - 5, 10, 10, MEDIAN, tip=f"median {row.median:g}",
            data_median=f"{row.median:g}",
        )  # fmt: skip
        if row.minimum is not None:
            _diamond(svg, x_of(row.minimum), y, row.minimum)
        svg.end()
    return svg.render()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--check", action="store_true", help="exit 1 if a committed plot differs")
    a = p.parse_args(argv)
    stale = []
    for plot in plots(SOURCE.read_text(encoding="utf-8")):
        path = ROOT / plot.path
        drawn = render(plot)
        if a.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != drawn:
                stale.append(plot.path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(drawn, encoding="utf-8")
            print(f"wrote {plot.path}: {len(plot.rows)} row(s)")
    if stale:
        print(
            f"stale plots (run python docs/plots/bench_ratios.py): {', '.join(stale)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
