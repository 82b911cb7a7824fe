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
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from specbind.core.errors import UsageError

# What the Hub accepts as a repo id: owner and name of letters, digits, '-', '_', '.'.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def cache_dir(env: Mapping[str, str]) -> Path:
    """Where huggingface_hub keeps downloaded repos, by its own environment variables."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def resolve(arg: str, env: Mapping[str, str] | None = None) -> str:
    """``arg`` as given when it is a path on disk or not a Hub id; else its snapshot in the
    local Hub cache (said on stderr), or a ``UsageError`` saying what to pass."""
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
    sys.stderr.write(
        f"specbind: note: {arg} read as a Hub id from the local Hub cache: {snapshot} "
        f"(revision {revision})\n"
    )
    return str(snapshot)


def _snapshot(repo: Path) -> tuple[Path | None, str]:
    """The snapshot ``refs/main`` names, else the only one; (None, "") when there is none."""
    ref = repo / "refs" / "main"
    if ref.is_file():
        revision = ref.read_text().strip()
        snap = repo / "snapshots" / revision
        if re.fullmatch(r"[0-9A-Za-z._-]+", revision) and snap.is_dir():
            return snap, f"{revision}, refs/main"
    snaps = sorted(p for p in (repo / "snapshots").glob("*") if p.is_dir())
    if len(snaps) == 1:
        return snaps[0], snaps[0].name
    if len(snaps) > 1:
        names = ", ".join(p.name for p in snaps)
        raise UsageError(
            f"{repo}: no refs/main and {len(snaps)} snapshots ({names}): pass the one to read, "
            f"{repo}/snapshots/<revision>"
        )
    return None, ""
