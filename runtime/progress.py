"""Progress bars on stderr, with tqdm imported only when a bar is shown.

Invariant: ``progress=None`` shows a bar only when stderr is a terminal (tqdm's own
``disable=None`` rule), ``True`` always, ``False`` never.
Trap: importing tqdm costs 25-35 ms (it reads its version through ``importlib.metadata``), more
than a third of ``import numpy``; a bind whose stderr is a pipe or a file (a launcher, a test, a
benchmark) must not pay it, so the import sits inside ``bar`` and only runs when one is drawn.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def shown(progress: bool | None) -> bool:
    if progress is not None:
        return progress
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # stderr replaced by an object without a tty, or closed
        return False


def bar(items: Iterable[T], progress: bool | None, desc: str, unit: str) -> Iterator[T]:
    """``items`` unchanged, under a tqdm bar when ``shown(progress)``."""
    if not shown(progress):
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, desc=desc, unit=unit)
