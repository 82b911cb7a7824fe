"""Layer and family name patterns: the one digit rule, formatting and matching. No I/O.

A pattern is a name holding at most one placeholder ``{word}``: a model's layer pattern
(``layers.{index}.``), a block's family member (``mlp.experts.{e}.down_proj.weight``), a name
rule's member (``block_sparse_moe.experts.{e}.w1.weight``). ``fill`` puts an index in the
placeholder's place; ``index_of``, ``Matcher`` and ``LayerPattern`` read it back.

The digit rule, the same for layer and member indices everywhere:
- an index is written in ASCII digits ``0-9``, ``0`` or with no leading zero, and in at most
  ``MAX_DIGITS`` (6) digits: ``0 .. 999_999`` (a layer count past ``1 << 16`` is refused as a
  broken config anyway, and no model has a million experts);
- so ``str(int(text)) == text`` for every index: one tensor has one name, and ``fill`` and the
  matchers are inverses of each other.
A name that breaks the rule is no layer and no member: nothing here raises for it, and it is
left to the callers' checks, which refuse it as an unknown or unclaimed tensor.

Traps:
- ``\\d``, ``str.isdigit``, ``str.isdecimal`` and ``int()`` take other scripts' digits:
  ``int("٣") == 3`` (Arabic-Indic), ``int("３") == 3`` (fullwidth), and ``"²".isdigit()``; read
  that way ``layers.٣.`` would be a second name of layer 3. The rule is written ``[0-9]``;
- a leading zero (``experts.07.w``) would be a second name of member 7, and ``int()`` also takes
  ``+7``, `` 7`` and ``7_0``: only a whole match of the rule is an index;
- ``int()`` raises past 4,300 digits; the width keeps every index cheap to read;
- a regex ``$`` also matches before a trailing newline: names are matched whole
  (``fullmatch``), so ``layers.3.x\\n`` is not ``layers.3.x``;
- ``Matcher`` tries its patterns in the order given and the first that matches wins.
"""

from __future__ import annotations

import re
from functools import lru_cache

from specbind.core.errors import GeometryError

MAX_DIGITS = 6
MAX_INDEX = 10**MAX_DIGITS - 1
INDEX = f"(?:0|[1-9][0-9]{{0,{MAX_DIGITS - 1}}})"  # regex text of one index, no group
PLACEHOLDER = re.compile(r"\{([a-z]+)\}")

_INDEX = re.compile(INDEX)


def is_index(text: str) -> bool:
    """``text`` is an index by the digit rule (``"7"`` yes; ``"07"``, ``"٣"``, ``"+7"`` no)."""
    return _INDEX.fullmatch(text) is not None


def placeholders(pattern: str) -> list[str]:
    """The placeholders' names in ``pattern``, in order (``experts.{e}.w`` -> ``["e"]``)."""
    return PLACEHOLDER.findall(pattern)


@lru_cache(maxsize=4096)
def parts(pattern: str) -> tuple[str, str | None, str]:
    """``(head, placeholder, tail)``; ``(pattern, None, "")`` when it holds none."""
    found = PLACEHOLDER.split(pattern)
    if len(found) == 1:
        return pattern, None, ""
    if len(found) != 3:
        raise ValueError(f"name pattern {pattern!r} holds more than one placeholder")
    return found[0], found[1], found[2]


def fill(pattern: str, index: int) -> str:
    """``pattern`` with ``index`` in its placeholder (``experts.{e}.w``, 7 -> ``experts.7.w``);
    a pattern without one names one tensor and is returned as is."""
    head, name, tail = parts(pattern)
    if name is None:
        return pattern
    if not 0 <= index <= MAX_INDEX:
        raise GeometryError(
            f"{pattern}: index {index} is outside 0..{MAX_INDEX} "
            f"(a layer or member index has at most {MAX_DIGITS} digits)"
        )
    return f"{head}{int(index)}{tail}"


@lru_cache(maxsize=4096)
def _member(pattern: str) -> re.Pattern[str]:
    head, name, tail = parts(pattern)
    if name is None:
        raise ValueError(f"name pattern {pattern!r} holds no placeholder")
    return re.compile(re.escape(head) + f"({INDEX})" + re.escape(tail))


def index_of(pattern: str, name: str) -> int | None:
    """The index of ``name`` as a member of ``pattern`` (which holds a placeholder), or None
    when it is not one."""
    m = _member(pattern).fullmatch(name)
    return None if m is None else int(m.group(1))


def member_of(name: str, pattern: str) -> bool:
    """``name`` is ``pattern`` or a member of its family (``experts.{e}.w`` -> ``experts.7.w``)."""
    if parts(pattern)[1] is None:
        return name == pattern
    return index_of(pattern, name) is not None


class Matcher:
    """Many family patterns at once, as one regex: which one a name is a member of, and the
    member's index (the first pattern in order that matches)."""

    __slots__ = ("_rx", "patterns")

    def __init__(self, patterns: tuple[str, ...]) -> None:
        self.patterns = patterns
        alts = [_member(p).pattern for p in patterns]  # one group each: the index
        self._rx = re.compile("|".join(alts)) if alts else None

    def match(self, name: str) -> tuple[str, int] | None:
        """``(pattern, index)`` of the family ``name`` is a member of, or None."""
        m = None if self._rx is None else self._rx.fullmatch(name)
        if m is None:
            return None
        g = m.lastindex
        assert g is not None
        return self.patterns[g - 1], int(m.group(g))


@lru_cache(maxsize=1024)
def matcher(patterns: tuple[str, ...]) -> Matcher:
    """The (cached) ``Matcher`` of these patterns, each holding one placeholder."""
    return Matcher(patterns)


class LayerPattern:
    """A model's layer pattern (``layers.{index}.``) under a name prefix (``model.``), or under
    any prefix (``None``: the shortest that matches), read off whole names."""

    __slots__ = ("_rx", "pattern", "prefix")

    def __init__(self, pattern: str, prefix: str | None = None) -> None:
        head, name, tail = parts(pattern)
        if name is None:
            raise ValueError(f"layer pattern {pattern!r} holds no placeholder")
        lead = ".*?" if prefix is None else re.escape(prefix)
        body = lead + re.escape(head) + f"({INDEX})" + re.escape(tail)
        self.pattern, self.prefix = pattern, prefix
        self._rx = re.compile(f"({body})(.+)", re.DOTALL)

    def matches(self, name: str) -> bool:
        """``name`` is under a layer (``split`` without reading the parts)."""
        return self._rx.fullmatch(name) is not None

    def split(self, name: str) -> tuple[str, int, str] | None:
        """``model.layers.7.mlp.w`` -> ``("model.layers.7.", 7, "mlp.w")``: the layer's full
        prefix, its index and the layer-relative rest (never empty); None outside any layer."""
        m = self._rx.fullmatch(name)
        if m is None:
            return None
        return m.group(1), int(m.group(2)), m.group(3)

    def format(self, index: int) -> str:
        """The full prefix of layer ``index`` (``prefix`` must be given)."""
        assert self.prefix is not None
        return self.prefix + fill(self.pattern, index)


@lru_cache(maxsize=256)
def layer_pattern(pattern: str, prefix: str | None = None) -> LayerPattern:
    """The (cached) ``LayerPattern`` of ``pattern`` under ``prefix``."""
    return LayerPattern(pattern, prefix)
