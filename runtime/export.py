"""Write bound weights to one ``.safetensors`` file, atomically and with bounded memory.

Tensors are named ``layers.{i}.{slot}.{field}`` and ``globals.{field}``; ``__metadata__``
records the model, the tp and ep sizes and ranks, the geometry and any ``--set`` overrides,
each layer's role and slot blocks, and the hash of the specs that generated the binders.

Written by hand rather than with ``safetensors.serialize_file`` because that call needs every
tensor's bytes in memory at once (a full-geometry bind is many GB); here each array streams
from its memory map to the file. Tests read the result back with the safetensors library.
Invariants: the file appears whole or not at all (temp file + fsync + ``os.replace``); tensor
order and header bytes are deterministic, so two binds give byte-identical files.

The output path is checked by ``check_out_path`` — by the CLI before any binding, and again by
``write_safetensors`` — and refused when it is:
- empty; or exists and is not a regular file (a directory, ``/dev/null`` or another device, a
  FIFO, a socket); or lies under a file, or in a directory this process cannot write;
- one of the input checkpoint's files: by resolved path, and by ``(st_dev, st_ino)`` so a hard
  link is caught too.
A symlink is written *through*, as ``open(path, "w")`` would: the path is resolved first and the
checks above apply to the target, which is replaced, never the link itself; a loop is refused.
Trap: ``os.replace`` on the unresolved path would swap a symlink (or a device node) for a
regular file, so always write to the path ``check_out_path`` returns.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specbind.core.dtypes import dtype_name
from specbind.core.errors import OutputError
from specbind.runtime.atomic import atomic_writer
from specbind.runtime.backends import Backend
from specbind.runtime.binding import Array

if TYPE_CHECKING:
    from specbind.runtime.bind import BindResult


def bind_metadata(
    model: str, specs_sha256: str, result: BindResult, values: dict[str, int],
    overrides: dict[str, int],
) -> dict[str, str]:  # fmt: skip
    """The ``__metadata__`` of an ``--out`` file: what was bound, from what, at which ranks."""
    return {
        "model": model,
        "specs_sha256": specs_sha256,
        "tp_size": str(result.ranks.tp_size),
        "tp_rank": str(result.ranks.tp_rank),
        "ep_size": str(result.ranks.ep_size),
        "ep_rank": str(result.ranks.ep_rank),
        "geometry": json.dumps(values, sort_keys=True),
        "overrides": json.dumps(overrides, sort_keys=True),
        "layers": json.dumps(
            {
                str(x.index): {"role": x.role, "slots": {k: v.block for k, v in x.slots.items()}}
                for x in result.layers
            },
            sort_keys=True,
        ),
        "tensors": str(len(result.fields())),  # a reload refuses a file missing one
    } | ({"quant": result.quant} if result.quant is not None else {})


def bound_tensors(result: BindResult, backend: Backend) -> dict[str, Array]:
    """Every bound field of a result on the host, by its name in an ``--out`` file."""
    return {name: backend.to_host(a, rule.dtype) for name, (rule, a) in result.fields().items()}


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
) -> Path:
    """The real path to write ``out`` to, or an ``OutputError`` saying why it must not be.

    ``inputs`` are the files being read (``Checkpoint.files()``); ``dirs`` are directories no
    output may land in, by its given or its resolved path (the checkpoint directory: a new
    ``model.safetensors`` beside an index would make the loader refuse it; and, for a Hub
    cache snapshot, the cache repo whose blobs its links share). ``what`` names the path in
    the message (the CLI passes ``--out``). Pass the string the user gave: ``Path("")`` is ``.``.
    """
    given = os.fspath(out)
    if given == "":
        raise OutputError(f"{what} '': an empty path; {what} names the .safetensors file to write")
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
        raise OutputError(
            f"{what} {shown}: is a directory; {what} names the .safetensors file to write"
        )
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
                    f"{what} {shown}: is inside {d}, the checkpoint being read; write the bound "
                    "weights outside it, so the checkpoint stays as it was"
                )
    parent = real.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent  # the first ancestor that exists: atomic_writer makes the rest
    if not os.path.isdir(parent):
        raise OutputError(f"{what} {shown}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {shown}: cannot write in {parent}")
    return real


def write_safetensors(
    path: Path,
    tensors: dict[str, Array],
    metadata: dict[str, str],
    inputs: Iterable[Path] = (),
    dirs: Iterable[Path] = (),
) -> int:
    """Write ``tensors`` to the real path of ``path`` (checked by ``check_out_path`` against
    ``inputs`` and ``dirs``); return the number of bytes written."""
    real = check_out_path(path, inputs, dirs=dirs)
    header: dict[str, object] = {"__metadata__": dict(sorted(metadata.items()))}
    pos = 0
    order = sorted(tensors)
    for name in order:
        a = tensors[name]
        header[name] = {
            "dtype": dtype_name(a),
            "shape": list(a.shape),
            "data_offsets": [pos, pos + a.nbytes],
        }
        pos += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # pad so the data buffer starts 8-byte aligned
    with atomic_writer(real) as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name in order:
            flat = np.ascontiguousarray(tensors[name]).reshape(-1)  # shape -> [n], row-major
            f.write(flat.view(np.uint8).data)  # a view of the mmap: no copy for verbatim fields
    return 8 + len(raw) + pos
