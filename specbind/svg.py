"""A tiny SVG writer: rectangles, text, lines and hatch patterns, as plain text, no dependency.

The pictures (``plan --svg``, ``audit --svg``) are written by specbind itself; a browser or an
XML parser reads them.

Invariants:
- every attribute value and every text node goes through ``attr`` / ``text``: escaped by
  ``xml.sax.saxutils`` (``& < > "``), and every character XML 1.0 cannot hold (a control
  character, a lone surrogate, U+FFFE/U+FFFF) replaced by its ``\\xNN``/``\\uNNNN`` spelling,
  so a checkpoint's tensor name, however hostile, is shown as text and the file always parses;
- element and attribute names are literals of this code, never data;
- ``data-*`` attributes carry the exact numbers a picture shows (bytes), so a test reads the
  picture's claims back with ``xml.etree`` rather than scraping its text.
Trap: a ``<title>`` is a tooltip only as the *first* child of the element it describes; ``box``
and ``group`` put it there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_chars(s: str) -> str:
    return _NOT_XML.sub(
        lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", s
    )


def text(s: object) -> str:
    """``s`` as an XML text node."""
    return escape(_xml_chars(str(s)))


def attr(s: object) -> str:
    """``s`` as a quoted XML attribute value (newlines kept as character references)."""
    return quoteattr(_xml_chars(str(s)), {"\n": "&#10;", "\r": "&#13;", "\t": "&#9;"})


def _attrs(kw: dict[str, object]) -> str:
    """Keyword arguments as attributes: ``_`` spells ``-`` (``font_size``, ``data_bytes``), a
    trailing ``_`` is dropped (``class_``); ``None`` leaves the attribute out."""
    return "".join(
        f" {k.rstrip('_').replace('_', '-')}={attr(v)}" for k, v in kw.items() if v is not None
    )


def human(n: int) -> str:
    """Bytes for a reader: ``3.74 GiB``, ``12.0 MiB``, ``512 B`` (binary units)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
    return f"{n} B"


class Svg:
    """An SVG document built in order, each call appending one element."""

    def __init__(self, width: int, height: int, title: str) -> None:
        self.width, self.height = width, height
        self._defs: list[str] = []
        self._body: list[str] = [f"<title>{text(title)}</title>"]

    def hatch(self, ident: str, colour: str, angle: int, gap: int = 6) -> str:
        """A pattern of ``colour`` stripes on white at ``angle`` degrees; its ``url(#…)``."""
        self._defs.append(
            f'<pattern id={attr(ident)} width="{gap}" height="{gap}" '
            f'patternUnits="userSpaceOnUse" patternTransform="rotate({angle})">'
            f'<rect width="{gap}" height="{gap}" fill="#ffffff"/>'
            f'<rect width="{gap // 2}" height="{gap}" fill={attr(colour)}/></pattern>'
        )
        return f"url(#{ident})"

    def box(
        self, x: float, y: float, w: float, h: float, fill: str, tip: str | None = None,
        **kw: object,
    ) -> None:  # fmt: skip
        """A rectangle; ``tip`` its tooltip."""
        head = f"<rect{_attrs({'x': _n(x), 'y': _n(y), 'width': _n(w), 'height': _n(h)})}"
        head += f" fill={attr(fill)}{_attrs(kw)}"
        self._body.append(f"{head}><title>{text(tip)}</title></rect>" if tip else f"{head}/>")

    def label(self, x: float, y: float, s: str, size: int = 12, **kw: object) -> None:
        """Text whose baseline starts at (x, y) (``text_anchor="end"`` to end there)."""
        kw = {"font_family": "sans-serif", "font_size": size, **kw}
        self._body.append(f"<text x={attr(_n(x))} y={attr(_n(y))}{_attrs(kw)}>{text(s)}</text>")

    def line(self, x1: float, y1: float, x2: float, y2: float, colour: str = "#999999") -> None:
        self._body.append(
            f"<line{_attrs({'x1': _n(x1), 'y1': _n(y1), 'x2': _n(x2), 'y2': _n(y2)})} "
            f"stroke={attr(colour)}/>"
        )

    def group(self, tip: str | None = None, **kw: object) -> None:
        """Open a ``<g>`` (closed by ``end``): its tooltip covers every child."""
        self._body.append(f"<g{_attrs(kw)}>" + (f"<title>{text(tip)}</title>" if tip else ""))

    def end(self) -> None:
        self._body.append("</g>")

    def render(self) -> str:
        defs = f"<defs>{''.join(self._defs)}</defs>\n" if self._defs else ""
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
            f'height="{self.height}" viewBox="0 0 {self.width} {self.height}">\n'
            f'{defs}<rect width="100%" height="100%" fill="#ffffff"/>\n'
            + "\n".join(self._body)
            + "\n</svg>\n"
        )


def _n(v: float) -> str:
    """A coordinate: an integer as such, else two decimals."""
    return str(int(v)) if float(v).is_integer() else f"{v:.2f}"


def target(
    given: str, inputs: Iterable[Path] = (), what: str = "--svg", dirs: Iterable[Path] = ()
) -> Path:
    """The path to write a picture to, checked before any work (``check_out_path``: never a
    directory, a device, a file of the checkpoint read, ``inputs``, or a path inside its
    directories, ``dirs``: ``CheckpointDir.dirs()``, as ``--out`` is refused there)."""
    from specbind.runtime.io.out_path import check_out_path

    return check_out_path(given, inputs, what, dirs, names="the .svg picture to write")


def write(path: Path, document: str) -> None:
    """Write ``document`` to ``path`` (from ``target``), whole or not at all."""
    from specbind.runtime.io.atomic import atomic_writer

    with atomic_writer(path) as f:
        f.write(document.encode("utf-8"))
