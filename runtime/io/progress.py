"""Progress bars on stderr, with tqdm imported only when a bar is shown.

Invariant: ``progress=None`` shows a bar only when stderr is a terminal (tqdm's own
``disable=None`` rule), ``True`` always, ``False`` never. A bar over bytes (``byte_bar``) counts
in binary units (KiB, MiB, GiB: ``unit_divisor=1024``) and shows the rate and the time left;
its total is what the caller will report, so it ends at 100 % exactly.
Trap: importing tqdm costs 25-35 ms (it reads its version through ``importlib.metadata``), more
than a third of ``import numpy``; a bind whose stderr is a pipe or a file (a launcher, a test, a
benchmark) must not pay it, so the import sits inside ``bar`` and only runs when one is drawn —
and a caller sizes a byte bar's steps only when ``shown`` says one will be drawn.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
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


@contextmanager
def byte_bar(
    total: int | None, progress: bool | None, desc: str
) -> Iterator[Callable[[int], None]]:
    """A function that advances a bar of ``total`` bytes, drawn when ``shown(progress)`` and
    ``total`` is given (else it does nothing): ``bind  42%|████  | 1.57G/3.74G [00:05<00:07,
    301MB/s]`` (binary units: G is GiB)."""
    if total is None or not shown(progress):
        yield lambda n: None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024) as t:

        def step(n: int) -> None:
            t.update(n)

        yield step
