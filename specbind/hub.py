"""A checkpoint named by its Hugging Face Hub id (``owner/name``) read from the local Hub cache.

specbind reads a directory and downloads nothing. A command-line checkpoint that is not a path
on disk but has the shape of a Hub id is looked up where ``huggingface_hub`` keeps its
downloads: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``; a repo
lies under ``models--{owner}--{name}/``, ``refs/main`` names the revision and
``snapshots/{revision}/`` holds the files (links into ``blobs/``).
Invariant: an existing path always wins (``./owner/name`` is never looked up); a Hub id found
is announced on stderr with the snapshot it reads; one not found is a one-line usage error
naming the snapshot directory to pass and where the cache is.
Trap: ``refs/main`` may be missing (a download by revision): then the one snapshot there is
read, and several are refused, naming them, rather than guessing the newest.
Invariants of ``refs/main`` (a file anyone can write, read before any check of the checkpoint):
- read bounded: at most ``REF_BYTES`` bytes, opened without blocking (a FIFO there never hangs
  the command) and refused unless a regular file, so a file of gigabytes costs one small read;
- its text must be what huggingface_hub writes there: a commit hash, 40 lowercase hex digits
  (``huggingface_hub.file_download.REGEX_COMMIT_HASH``; ``_cache_commit_hash_for_specific_revision``
  writes the hash and nothing else), a trailing newline tolerated. Anything else (``..``, a
  path, bytes that are not ASCII) is refused in one line showing it cut (``core.shown``); a
  name that is never a path component cannot make ``snapshots/<it>`` the repo folder;
- the snapshot it names must be there: a ``refs/main`` naming a snapshot the cache lacks is
  refused, never replaced by another snapshot (huggingface_hub's ``try_to_load_from_cache``
  does not guess either).
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

from specbind.core.errors import CheckpointError, UsageError
from specbind.core.shown import shown

# What the Hub accepts as a repo id: owner and name of letters, digits, '-', '_', '.'.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
# What huggingface_hub writes in refs/<branch>: a commit hash (file_download.REGEX_COMMIT_HASH).
COMMIT_HASH = re.compile(r"[0-9a-f]{40}")
REF_BYTES = 64  # a ref is 40 characters; a file longer than this is not one, whatever it holds


def cache_dir(env: Mapping[str, str]) -> Path:
    """Where huggingface_hub keeps downloaded repos, by its own environment variables."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def resolve(arg: str, env: Mapping[str, str] | None = None, note: bool = True) -> str:
    """``arg`` as given when it is a path on disk or not a Hub id; else its snapshot in the
    local Hub cache (said on stderr unless ``note`` is False: the API, whose ``Checkpoint.path``
    says it), or a ``UsageError`` saying what to pass."""
    if os.path.lexists(arg) or not HUB_ID.fullmatch(arg) or ".." in arg.split("/"):
        return arg
    env = os.environ if env is None else env
    cache = cache_dir(env)
    owner, name = arg.split("/")
    repo = cache / f"models--{owner}--{name}"
    snapshot, revision = _snapshot(repo)
    if snapshot is None:
        raise UsageError(
            f"{arg}: no such directory, and as a Hub id it is not in the local Hub cache "
            f"({cache}; HF_HUB_CACHE or HF_HOME moves it): download it (`hf download {arg}`), "
            f"then pass its snapshot, {repo}/snapshots/<revision>, or a directory holding its "
            "config.json and *.safetensors"
        )
    if note:
        sys.stderr.write(
            f"specbind: note: {arg} read as a Hub id from the local Hub cache: {snapshot} "
            f"(revision {revision})\n"
        )
    return str(snapshot)


def read_ref(ref: Path) -> str | None:
    """The commit hash ``ref`` (``refs/main``) names; None when there is no such file; a
    ``CheckpointError`` for anything that is not a hash as huggingface_hub writes it."""
    try:  # O_NONBLOCK: opening a FIFO for reading would wait for a writer
        fd = os.open(ref, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise CheckpointError(f"{ref}: cannot be read: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(
                f"{ref}: is not a regular file; huggingface_hub writes a commit hash there"
            )
        data = os.read(fd, REF_BYTES + 1)
    finally:
        os.close(fd)
    text = data.decode("latin-1")  # every byte is one character: shown as it is, never decoded
    revision = text[:-1] if text.endswith("\n") else text
    if len(data) > REF_BYTES or not COMMIT_HASH.fullmatch(revision):
        what = f"{st.st_size} B" if len(data) > REF_BYTES else shown(data)
        raise CheckpointError(
            f"{ref}: holds {what}, not a commit hash (40 lowercase hex digits, as huggingface_hub "
            "writes it): the cache entry is damaged; pass the snapshot directory to read"
        )
    return revision


def _snapshot(repo: Path) -> tuple[Path | None, str]:
    """The snapshot ``refs/main`` names, else the only one; (None, "") when there is none."""
    ref = repo / "refs" / "main"
    revision = read_ref(ref)
    snaps = sorted(p for p in (repo / "snapshots").glob("*") if p.is_dir())
    if revision is not None:
        snap = repo / "snapshots" / revision
        if not snap.is_dir():
            raise CheckpointError(
                f"{ref}: names revision {revision}, but {snap} is not there "
                f"(snapshots there: {_names(snaps)}): download it again, or pass the snapshot "
                "to read"
            )
        return snap, f"{revision}, refs/main"
    if len(snaps) == 1:
        return snaps[0], snaps[0].name
    if len(snaps) > 1:
        raise UsageError(
            f"{repo}: no refs/main and {len(snaps)} snapshots ({_names(snaps)}): pass the one "
            f"to read, {repo}/snapshots/<revision>"
        )
    return None, ""


def _names(snaps: list[Path], most: int = 8) -> str:
    """The snapshots there, for a message: at most ``most`` names, each cut."""
    if not snaps:
        return "no snapshot"
    names = ", ".join(shown(p.name) for p in snaps[:most])
    return names + (f" and {len(snaps) - most} more" if len(snaps) > most else "")
