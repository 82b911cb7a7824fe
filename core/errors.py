"""specbind's error types: every refusal is one of these, with one clear message.

Invariant: the CLI prints ``str(error)`` of a ``SpecbindError`` on one line and exits non-zero;
anything else escaping is a bug in specbind, reported as such (never a bare traceback).
Two kinds, told apart by the exit status (``specbind.cli.EXIT``): a refusal (the checkpoint, its
config, a spec or a bound file is wrong: exit 1) and a ``UsageError`` (what was asked cannot be
done as asked: a flag, a value out of range, a path that is not there: exit 2, as argparse's own
usage errors). Trap: a usage error that is also a refusal class (``NoCheckpointError`` is a
``CheckpointError``) keeps working for a caller that catches the refusal class.
"""

from __future__ import annotations


class SpecbindError(Exception):
    """Base of every error specbind raises on purpose."""


class UsageError(SpecbindError):
    """What was asked is malformed, not what was read: a flag, an argument, a value out of
    range, a path that is not there. Nothing of the checkpoint is judged."""


class SpecError(SpecbindError):
    """A spec file is malformed: names the file, the path inside it and the line."""

    def __init__(self, file: str, path: str, line: int | None, message: str) -> None:
        self.file = file
        self.path = path
        self.line = line
        self.message = message
        where = file if line is None else f"{file}:{line}"
        at = f" at {path}" if path else ""
        super().__init__(f"{where}{at}: {message}")


class AlgebraError(SpecbindError):
    """A shape or constraint expression is malformed or cannot be evaluated."""


class GeometryError(SpecbindError):
    """The geometry (config.json values, tp) is invalid or breaks a declared constraint."""


class DerivedError(GeometryError):
    """A block's derived symbol cannot be computed at this geometry (``hidden / heads`` with a
    remainder): carries the block's symbols it reads, so the model table can name their
    config.json fields (``runtime.binder.tables.BlockEntry``)."""

    def __init__(self, message: str, symbols: tuple[str, ...], sizes: tuple[str, ...]) -> None:
        super().__init__(message)
        self.symbols = symbols  # the block symbols the expression reads
        self.sizes = sizes  # the block's tensors whose shapes use it


class CheckpointError(SpecbindError):
    """A checkpoint file, header, index or config.json is malformed or unsafe."""


class NoCheckpointError(CheckpointError, UsageError):
    """The checkpoint path does not exist or is not a directory: nothing to judge."""


class OverrideError(GeometryError, UsageError):
    """An override (``--set``, ``overrides=``) naming no geometry symbol, or not an integer."""


class RankError(GeometryError, UsageError):
    """A tp or ep size or rank out of range (``--tp-size``, ``--ep-rank``, a launcher's)."""


class BindError(SpecbindError):
    """A layer's tensors do not match its block spec; names the layer and the tensor."""


class GenerateError(SpecbindError):
    """generated/ is stale, holds orphans, or could not be written."""


class OutputError(SpecbindError):
    """An output path is unsafe to write: not a regular file, or a file being read."""


class ReloadError(SpecbindError):
    """A bound (``--out``) file these binders must not hand out: another spec, model, geometry,
    layout or rank than asked, or tensors its metadata does not explain."""


def at(layer: int) -> str:
    """Where a tensor sits, for messages: ``layer 7``, or ``model`` for the global tensors."""
    return f"layer {layer}" if layer >= 0 else "model"


class DistributedError(SpecbindError):
    """The ranks of one bind disagree, lost each other, or one of them failed: names the rank."""
