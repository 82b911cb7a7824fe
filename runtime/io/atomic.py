"""Write a file so that it appears whole or not at all.

Invariants:
- bytes go to a temporary file in the same directory, are fsync'd, and replace the target with
  ``os.replace`` (atomic on POSIX); on any error, or an interrupt, the temporary file is removed
  and the previous target is left exactly as it was. The file gets the mode a plain ``open``
  would give it (0666 less the umask);
- the temp name is ``.<stem>.<pid>-<8 hex>.tmp`` and always fits in ``NAME_MAX`` (255 bytes):
  ``<stem>`` is the target's name, or for a name too long for that, its first bytes and a hash
  of the whole (so a legal 252-byte target still gets a temp file);
- the writer holds an exclusive ``flock`` on its temp file from the moment it exists until the
  target is replaced (or the temp removed): a process killed outright (SIGKILL, the OOM killer)
  cannot remove its temp, but the kernel drops its lock;
- before writing, the temps of earlier writers to the same target that are provably dead are
  removed, and one ``specbind: note:`` line on stderr says so: a temp is removed only when its
  lock can be taken (no live writer holds it, on this host or another sharing the file system)
  and either its pid is gone (or a zombie) or it is older than ``STALE_S`` (a reused pid). A
  live writer's temp is never touched: it holds the lock, and in the instant between creating
  its temp and locking it, its pid is alive and its temp new.
- an ``OSError`` of the writer's own steps (create, flush, fsync, replace) is one
  ``OutputError`` line naming the target (``write_failed``: and how far the write got).
Trap: ``flock`` locks belong to the open file description, so the lock must be held on the
descriptor the bytes go through, and kept through ``os.replace``: closed before it, another
bind could take the lock and remove a finished temp.
"""

from __future__ import annotations

import errno
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from specbind.core.errors import OutputError

NAME_MAX = 255
STALE_S = 60.0  # a lockable temp at least this old is stale even if its pid is alive (reused)
_TAIL = len(".4194304-01234567.tmp")  # the longest pid Linux gives (pid_max 2**22), hex, suffix


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def temp_stem(name: str) -> str:
    """The part of a temp name that names the target ``name``: ``name`` itself when
    ``.<name>.<pid>-<hex>.tmp`` fits in ``NAME_MAX`` bytes, else its first characters and the
    first 16 hex digits of its SHA-256 (the same for every writer of that target)."""
    room = NAME_MAX - 1 - _TAIL
    if len(os.fsencode(name)) <= room:
        return name
    import hashlib

    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
    head = os.fsencode(name)[: room - 1 - len(digest)]
    return f"{head.decode('utf-8', 'ignore')}~{digest}"  # cut on a character boundary


def _pattern(stem: str) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(stem)}\.([0-9]+)-[0-9a-f]{{8}}\.tmp")


def write_failed(path: Path | str, e: BaseException, at: int | None = None) -> OutputError:
    """The one line for a write to ``path`` that failed with ``e``, and ``at`` which byte of the
    file the failed write began (how far a full disk let it get)."""
    why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
    where = f" at byte {at}" if at is not None else ""
    return OutputError(f"{path}: writing failed{where}: {why}")


def _alive(pid: int) -> bool:
    """``pid`` is a running process here (a zombie is not: its descriptors are closed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def remove_stale(path: Path, note: Callable[[str], None] | None = None) -> list[str]:
    """Remove the temps of dead writers to ``path`` (see the module docstring); return their
    names, and say so through ``note`` (default: one line on stderr)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): nothing can be proven dead
        return []
    pat = _pattern(temp_stem(path.name))
    try:
        names = sorted(n for n in os.listdir(path.parent) if pat.fullmatch(n))
    except OSError:
        return []
    gone: list[tuple[str, int]] = []
    for name in names:
        match = pat.fullmatch(name)
        assert match is not None
        pid = int(match.group(1))
        if pid == os.getpid():
            continue  # this process's own writer (another thread): alive by definition
        tmp = path.parent / name
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # gone already, or not a file we may touch
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            st = os.fstat(fd)
            if _alive(pid) and time.time() - st.st_mtime < STALE_S:
                continue  # a writer between creating its temp and locking it
            now = os.lstat(tmp)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                continue  # replaced under us: not the file we locked
            os.unlink(tmp)
            gone.append((name, st.st_size))
        except OSError:
            continue  # locked by a live writer (EWOULDBLOCK), or removed meanwhile
        finally:
            os.close(fd)
    if gone:
        total = sum(n for _, n in gone)
        more = f" and {len(gone) - 3} more" if len(gone) > 3 else ""
        shown = ", ".join(n for n, _ in gone[:3]) + more
        line = (
            f"specbind: note: removed {len(gone)} temp file(s) of an earlier write to {path} "
            f"that did not finish ({shown}; {total} B; their writers are gone)"
        )
        (note or (lambda s: sys.stderr.write(s + "\n")))(line)
    return [n for n, _ in gone]


def _create(path: Path) -> tuple[int, Path]:
    """A new temp file beside ``path``, open and locked."""
    import secrets

    stem = temp_stem(path.name)
    for _ in range(100):
        tmp = path.parent / f".{stem}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            continue
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new and ours: cannot be held
        except ImportError:
            pass
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return fd, tmp
    raise FileExistsError(errno.EEXIST, "no unused temp name", str(path.parent))


@contextmanager
def atomic_writer(path: Path, note: Callable[[str], None] | None = None) -> Iterator[BinaryIO]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(path, note)
        fd, tmp = _create(path)
    except OSError as e:
        raise OutputError(f"{path}: cannot create its temp file: {e.strerror or e}") from None
    f = os.fdopen(fd, "wb")
    try:
        yield f
        try:
            f.flush()
            os.fsync(fd)
            os.fchmod(fd, 0o666 & ~_umask())  # created 0600; give the file the usual mode
            os.replace(tmp, path)  # still locked: no other bind may take the finished temp
        except OSError as e:
            raise write_failed(path, e) from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        with suppress(OSError):  # after a failed flush, close flushes (and fails) again
            f.close()  # closes the descriptor, and so drops the lock, either way
