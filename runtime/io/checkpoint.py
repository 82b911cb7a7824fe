"""A checkpoint directory: ``model.safetensors``, or shards plus ``model.safetensors.index.json``.

Invariants:
- an index entry's *name* stays inside the directory as written: no absolute path, no ``..``,
  no backslash, no NUL, nothing the file system cannot spell (a lone surrogate);
- every file read (each shard the index names, ``model.safetensors``, the index itself and
  ``config.json``) must be in the directory as a regular file or a symlink; a symlink is
  followed and its final target must be a regular file, inside the directory — or, only when
  the directory has the Hugging Face Hub cache shape (``<repo>/snapshots/<rev>/``), inside that
  same repo's ``<repo>/blobs/``, where ``snapshot_download`` puts the bytes. Anything else (a
  link to ``/etc/passwd``, into another repo's blobs, through a ``blobs`` that is itself a
  symlink) is refused naming the entry and where it resolves. The rule is the same for the
  sharded and the single-file layout, and the file opened is the real path that was checked;
- every tensor the index names must be in that shard's header, and every tensor in a shard
  must be named by the index (nothing is silently ignored); a tensor the index maps to the
  wrong shard is reported as such, with the shard that does hold it;
- a ``*.safetensors`` file no index entry names (``consolidated.safetensors`` beside HF shards)
  is not read, and ``unindexed_files`` lists it so the audit can say so;
- a tensor name appears in exactly one shard;
- shards are opened lazily, each once, and read through memory maps, one descriptor each (every
  shard of an index is open at once): a soft ``RLIMIT_NOFILE`` too low for them all (1,024 is
  a common default) is raised as far as they need, never past the hard limit, as many tools
  do (``make_room``); past the hard limit the open is refused up front naming the limit and
  the shard count, not at some shard with "Too many open files". The limit is never lowered;
  ``select()``-based code is not affected below 1,024;
- ``config.json`` must be a JSON object;
- a JSON file is read only up to a cap: ``MAX_JSON_BYTES`` (64 MiB) for the index, which names
  every tensor; ``MAX_CONFIG_BYTES`` (16 MiB) for ``config.json`` and the side files beside it
  (``hf_quant_config.json``), which hold settings and pattern lists — a real one is kilobytes,
  and an explicit per-expert list of a 61-layer, 384-expert model about 4 MB.
Trap: ``files()`` lists paths as named in the directory, not resolved; compare real paths (and
inodes) when asking whether some other path is one of them, as ``out_path.check_out_path`` does.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Any

from specbind.core.errors import CheckpointError, NoCheckpointError
from specbind.core.shown import shown
from specbind.runtime.io.safetensors_file import SafetensorsFile
from specbind.runtime.io.source import RawTensor

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def read_json(path: Path, what: str, cap: int = MAX_JSON_BYTES) -> Any:
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{what}: not a regular file")
        if st.st_size > cap:
            raise CheckpointError(f"{what}: {st.st_size} B is over the {cap} B cap")
        raw = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{what}: cannot read: {e.strerror}") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise CheckpointError(f"{what}: not UTF-8") from None
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{what}: not valid JSON: {e}") from None


# descriptors ``make_room`` leaves for all but the shards: at least MIN_SPARE (read_view's 8, the
# output, the index), and SPARE where the hard limit allows
MIN_SPARE = 16
SPARE = 48


def _open_now() -> int:
    """Descriptors this process holds now (an estimate where /proc is not there)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less listdir's own
    except OSError:
        return 3 + SPARE


def make_room(shards: int, where: str) -> None:
    """Make sure ``shards`` more files can be open at once, or refuse naming ``where``."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    least = _open_now() + shards + MIN_SPARE
    want = least - MIN_SPARE + SPARE
    if soft == resource.RLIM_INFINITY or want <= soft:
        return
    if hard != resource.RLIM_INFINITY and least > hard:
        raise CheckpointError(
            f"{where}: {shards} shard files to open at once, but this process may hold at most "
            f"{hard} open files (RLIMIT_NOFILE hard limit; at least {least} needed); raise it "
            "(ulimit -n, LimitNOFILE= in a systemd unit)"
        )
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as e:
        raise CheckpointError(
            f"{where}: {shards} shard files to open at once, but the open-file limit is {soft} "
            f"and raising it to {target} failed ({e}); raise it (ulimit -n)"
        ) from None


def _encodable(fn: str) -> bool:
    """``fn`` has a file-system spelling (a lone surrogate from JSON ``"\\ud800"`` has none)."""
    try:
        os.fsencode(fn)
    except UnicodeEncodeError:
        return False
    return True


class CheckpointDir:
    """Every tensor of a checkpoint directory by full name, lazily."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        try:
            mode = self.root.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            raise NoCheckpointError(f"{self.root}: no such directory") from None
        except OSError as e:
            raise NoCheckpointError(f"{self.root}: cannot read: {e.strerror}") from None
        if not stat.S_ISDIR(mode):
            raise NoCheckpointError(f"{self.root}: not a directory")
        self._real_root = self.root.resolve()
        self._files: dict[str, SafetensorsFile] = {}
        self._real: dict[str, Path] = {}  # file name as named -> its checked real path
        self._where: dict[str, str] = {}  # tensor name -> shard file name
        self._used: list[str] = []  # the weight files read, then the index if there is one
        has_index = os.path.lexists(self.root / INDEX)
        if has_index and os.path.lexists(self.root / SINGLE):
            raise CheckpointError(
                f"{self.root}: holds both {SINGLE} and {INDEX}; transformers would read "
                f"{SINGLE} — remove the one you do not mean, rather than have specbind guess"
            )
        if has_index:
            self._load_index(self._resolve(INDEX, INDEX))
        elif os.path.lexists(self.root / SINGLE):
            f = self._open(SINGLE, SINGLE)
            self._where = dict.fromkeys(f.names(), SINGLE)
            self._used = [SINGLE]
        else:
            shards = sorted(p.name for p in self.root.glob("*.safetensors"))
            hint = f" (found {shards[:3]} but no {INDEX})" if shards else ""
            raise CheckpointError(f"{self.root}: no {SINGLE} and no {INDEX}{hint}")

    def _load_index(self, index: Path) -> None:
        doc = read_json(index, f"{self.root / INDEX}")
        if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
            raise CheckpointError(f"{INDEX}: must be an object with a weight_map object")
        wm: dict[str, Any] = doc["weight_map"]
        for name, fn in wm.items():
            if not isinstance(fn, str):
                raise CheckpointError(f"{INDEX}: weight_map[{shown(name)}] is not a file name")
            if fn not in self._real:  # each file is checked once, named by its first tensor
                self._check_name(fn, name)
                self._resolve(fn, f"{INDEX}: {shown(name)} -> {shown(fn)}")
        self._used = sorted(set(wm.values()))
        make_room(len(self._used), str(self.root))  # every shard is open at once, from here
        for fn in self._used:
            f = self._open(fn, fn)
            for t in f.names():
                owner = wm.get(t)
                if owner is None:
                    raise CheckpointError(
                        f"{fn}: tensor {shown(t)} is not in {INDEX} (it would be ignored)"
                    )
                if owner != fn:
                    if t in self._open(owner, owner).entries:
                        raise CheckpointError(f"tensor {shown(t)} is in both {fn} and {owner}")
                    raise CheckpointError(
                        f"{INDEX}: maps {shown(t)} to {owner}, but it is stored in {fn}"
                    )
        for name, fn in wm.items():
            if name not in self._files[fn].entries:
                raise CheckpointError(
                    f"{INDEX}: {shown(name)} maps to {fn}, which does not hold it"
                )
        self._where = dict(wm)
        self._used.append(INDEX)

    def _check_name(self, fn: str, name: str) -> None:
        """An index entry's file name must stay inside the directory, as written."""
        if "\0" in fn or len(fn) > 255 or not _encodable(fn):
            cut = fn[:40].replace("\0", "\\0") + ("…" if len(fn) > 40 else "")
            raise CheckpointError(f"{INDEX}: {shown(name)} names an impossible file {cut!r}")
        p = Path(fn)
        if (
            p.is_absolute()
            or fn.startswith(("/", "\\"))
            or ".." in p.parts
            or "\\" in fn
            or fn in {"", "."}
        ):
            raise CheckpointError(
                f"{INDEX}: {shown(name)} points outside the checkpoint directory: {shown(fn)}"
            )

    def _resolve(self, fn: str, what: str) -> Path:
        """The real path of the regular file the entry ``fn`` is, or links to, by the rule in the
        module docstring; ``what`` names the entry in the refusal."""
        entry = self.root / fn
        try:
            mode = entry.lstat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            raise CheckpointError(f"{what}: no such file") from None
        except OSError as e:
            raise CheckpointError(f"{what}: cannot read: {e.strerror}") from None
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise CheckpointError(f"{what}: not a regular file")
        try:
            real = entry.resolve(strict=True)
        except FileNotFoundError:  # name the missing end (a Hub blob an interrupted download lacks)
            gone = os.path.realpath(entry)
            raise CheckpointError(
                f"{what}: a symlink whose target does not exist (it resolves to {gone})"
            ) from None
        except (OSError, RuntimeError):  # a symlink loop: RuntimeError before Python 3.13
            raise CheckpointError(f"{what}: a symlink that cannot be resolved (a loop?)") from None
        if not (real.is_relative_to(self._real_root) or self._in_hub_blobs(real)):
            raise CheckpointError(f"{what} resolves outside the checkpoint directory, to {real}")
        try:
            target = real.stat().st_mode
        except OSError as e:
            raise CheckpointError(f"{what}: cannot read {real}: {e.strerror}") from None
        if not stat.S_ISREG(target):
            raise CheckpointError(f"{what}: resolves to {real}, which is not a regular file")
        self._real[fn] = real
        return real

    def _in_hub_blobs(self, real: Path) -> bool:
        """``real`` is in the blobs/ of the Hub cache repo whose snapshot this directory is."""
        snapshots = self._real_root.parent
        if snapshots.name != "snapshots":
            return False
        return real.is_relative_to(snapshots.parent / "blobs")  # blobs itself is not followed

    def _open(self, fn: str, what: str) -> SafetensorsFile:
        f = self._files.get(fn)
        if f is None:
            real = self._real.get(fn) or self._resolve(fn, what)
            f = SafetensorsFile(real, fn)
            self._files[fn] = f
        return f

    def files(self) -> list[Path]:
        """The files of the directory this checkpoint is read from, as named there: the weight
        files in use, the index if there is one, and ``config.json`` if it exists. Symlinks are
        not resolved here (a caller comparing paths resolves them)."""
        extra = ["config.json"] if os.path.lexists(self.root / "config.json") else []
        return [self.root / fn for fn in self._used + extra]

    def dirs(self) -> list[Path]:
        """The directories this checkpoint lives in: its own, and for a Hub cache snapshot
        (``<repo>/snapshots/<rev>``) the cache repo, whose ``blobs/`` its links point into."""
        out = [self.root]
        for root in (self.root.absolute(), self.root.resolve()):  # named or reached by link
            if root.parent.name == "snapshots":
                out.append(root.parent.parent)
        return out

    def names(self) -> list[str]:
        return list(self._where)

    def get(self, name: str) -> RawTensor | None:
        fn = self._where.get(name)
        return None if fn is None else self._files[fn].raw(name)

    def file_of(self, name: str) -> str | None:
        """The shard file (relative to ``root``) that holds ``name``, or None."""
        return self._where.get(name)

    def release(self, names: Iterable[str]) -> None:
        """Drop this process's map pages of ``names`` (the page cache keeps them): a streaming
        bind calls it after each layer, so its RSS does not grow by every byte it has read.
        Safe while a view lives: a later read maps the pages again from the file."""
        for name in names:
            fn = self._where.get(name)
            if fn is not None:
                self._files[fn].release(name)

    def check_sizes(self) -> None:
        """Refuse, naming it, a shard shorter now than when it was opened: a bind calls it once
        done, before its output is kept, so a file truncated after its last tensor was taken
        (whose last page then reads as zeros, not SIGBUS) is not bound silently."""
        for f in self._files.values():
            f.check_size()

    def unindexed_files(self) -> list[str]:
        """``*.safetensors`` files in the directory that no index entry names (left unread)."""
        used = set(self._where.values())
        return sorted(p.name for p in self.root.glob("*.safetensors") if p.name not in used)

    def side_file(self, fn: str) -> Any | None:
        """A JSON file beside the weights (``hf_quant_config.json``), read under the same rules
        as ``config.json``; None when the directory has no such entry."""
        if not os.path.lexists(self.root / fn):
            return None
        return read_json(self._resolve(fn, fn), fn, MAX_CONFIG_BYTES)

    @cached_property
    def config(self) -> dict[str, Any]:
        if not os.path.lexists(self.root / "config.json"):
            raise CheckpointError(f"{self.root}: no config.json")
        doc = read_json(
            self._resolve("config.json", "config.json"), "config.json", MAX_CONFIG_BYTES
        )
        if not isinstance(doc, dict):
            raise CheckpointError("config.json: must be a JSON object")
        return doc
