"""Write a file so that it appears whole or not at all.

Invariant: bytes go to a temporary file in the same directory, are fsync'd, and replace the
target with ``os.replace`` (atomic on POSIX); on any error, or an interrupt, the temporary file
is removed and the previous target is left exactly as it was. The file gets the mode a plain
``open`` would give it (0666 less the umask), not ``mkstemp``'s 0600.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    import tempfile  # here, not at the top: 15 ms of every CLI start, needed only to write

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
