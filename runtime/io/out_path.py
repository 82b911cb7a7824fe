"""Where an output file may be written: ``check_out_path``, asked before any byte is bound.

Called by the CLI before any binding (``bind --out``, each rank's ``--out-dir`` file and the
index, the ``--svg`` picture of ``audit`` and ``plan``), and again by
``stream_out.StreamWriter`` as it opens the file. A path is refused when it is:
- empty; or exists and is not a regular file (a directory, ``/dev/null`` or another device, a
  FIFO, a socket); or lies under a file, or in a directory this process cannot write;
- one of the input checkpoint's files: by resolved path, and by ``(st_dev, st_ino)`` so a hard
  link is caught too; or inside the checkpoint's directories.
A symlink is written *through*, as ``open(path, "w")`` would: the path is resolved first and the
checks above apply to the target, which is replaced, never the link itself; a loop is refused.
Trap: ``os.replace`` on the unresolved path would swap a symlink (or a device node) for a
regular file, so always write to the path ``check_out_path`` returns.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from specbind.core.errors import OutputError

_KINDS = [
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
]


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_out_path(
    out: str | os.PathLike[str],
    inputs: Iterable[Path] = (),
    what: str = "output",
    dirs: Iterable[Path] = (),
    names: str = "the .safetensors file to write",
) -> Path:
    """The real path to write ``out`` to, or an ``OutputError`` saying why it must not be.

    ``inputs`` are the files being read (``CheckpointDir.files()``); ``dirs`` are directories no
    output may land in, by its given or its resolved path (the checkpoint directory: a new
    ``model.safetensors`` beside an index would make the loader refuse it; and, for a Hub
    cache snapshot, the cache repo whose blobs its links share). ``what`` names the path in
    the message (the CLI passes ``--out``), ``names`` what such a path names (``--svg``: the
    picture). Pass the string the user gave: ``Path("")`` is ``.``.
    """
    given = os.fspath(out)
    if given == "":
        raise OutputError(f"{what} '': an empty path; {what} names {names}")
    if "\0" in given:
        raise OutputError(f"{what} {given!r}: a path cannot hold a NUL byte")
    try:
        real = Path(given).resolve()
    except (OSError, RuntimeError):  # a symlink loop: RuntimeError before Python 3.13
        raise OutputError(f"{what} {given}: a symlink that cannot be resolved (a loop?)") from None
    shown = given if str(real) == os.path.abspath(given) else f"{given} (-> {real})"
    try:
        st: os.stat_result | None = real.lstat()
    except (FileNotFoundError, NotADirectoryError):
        st = None  # not there yet (or under a file: refused below, naming that file)
    except OSError as e:
        raise OutputError(f"{what} {shown}: cannot stat: {e.strerror}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{what} {shown}: is a directory; {what} names {names}")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(
            f"{what} {shown}: exists and is {_kind(st.st_mode)}, not a regular file; "
            "refusing to replace it"
        )
    for p in inputs:
        try:
            same_path = p.resolve() == real
            pst = p.stat()
        except (OSError, RuntimeError):
            continue  # an input that cannot be resolved is not a file this path could be
        if same_path:
            raise OutputError(
                f"{what} {shown}: is a file of the checkpoint being read ({p}); "
                "writing it would destroy the checkpoint"
            )
        if st is not None and (st.st_dev, st.st_ino) == (pst.st_dev, pst.st_ino):
            raise OutputError(
                f"{what} {shown}: is a hard link to {p}, a file of the checkpoint being read; "
                "writing it would destroy the checkpoint"
            )
    given_abs = Path(os.path.abspath(given))
    for d in dirs:
        inside = d.resolve()
        for candidate in (given_abs, real):
            if candidate.is_relative_to(inside) or candidate.is_relative_to(d.absolute()):
                raise OutputError(
                    f"{what} {shown}: is inside {d}, the checkpoint being read; write "
                    f"{'the picture' if what == '--svg' else 'the bound weights'} outside it, so "
                    "the checkpoint stays as it was"
                )
    parent = real.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent  # the first ancestor that exists: atomic_writer makes the rest
    if not os.path.isdir(parent):
        raise OutputError(f"{what} {shown}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {shown}: cannot write in {parent}")
    return real
