"""specbind's error types: every refusal is one of these, with one clear message.

Invariant: the CLI prints ``str(error)`` of a ``SpecbindError`` on one line and exits non-zero;
anything else escaping is a bug in specbind, reported as such (never a bare traceback).
"""

from __future__ import annotations


class SpecbindError(Exception):
    """Base of every error specbind raises on purpose."""


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


class CheckpointError(SpecbindError):
    """A checkpoint file, header, index or config.json is malformed or unsafe."""


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
