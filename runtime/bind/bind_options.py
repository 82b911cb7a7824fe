"""The binding options one object carries to every bind: the CLI's ``bind`` (and its torchrun
and ``--out-dir`` path) builds it from its flags, the API's ``Checkpoint.bind`` takes it (or
the same names as keywords), so an engine gets whatever the command line gives.

Invariants: the object is frozen and checked when made — an unknown quantized output is
refused naming the known ones; ``quant_output`` is a sorted tuple without repeats (a single
string is one output), so two equal requests are equal objects.
Trap: importing this module loads only the standard library and ``core.errors`` (``import
specbind`` re-exports it and must stay fast); the list of outputs is read when an object is made.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from specbind.core.errors import BindError
from specbind.core.record import record
from specbind.core.shown import shown


@record
class BindOptions:
    """``quant_output``: optional layouts of quantized fields besides the packed one
    (``"swizzled"`` block scales, ``"dequantized"`` BF16), as ``--quant-output``;
    ``allow_unshared_scales``: accept scales the blocks declare shared that differ, as
    ``--allow-unshared-scales``; ``progress``: a bar on stderr (None: only on a terminal), as
    ``--progress``/``--no-progress`` (the API's default is none, the CLI's a terminal's);
    ``mtp``: bind the MTP layers config.json counts (False binds the decoder alone, as
    ``--no-mtp``: for an engine that does not speculate, or a checkpoint saved without them)."""

    quant_output: tuple[str, ...] = ()
    allow_unshared_scales: bool = False
    progress: bool | None = False
    mtp: bool = True

    def __post_init__(self) -> None:
        from specbind.runtime.binder.quant import OUTPUTS

        given: Any = self.quant_output
        outs = (given,) if isinstance(given, str) else tuple(_iterable(given))
        unknown = sorted({o for o in outs if o not in OUTPUTS}, key=repr)
        if unknown:
            raise BindError(
                f"unknown quantized output(s) {shown(unknown)} (known: {list(OUTPUTS)})"
            )
        object.__setattr__(self, "quant_output", tuple(sorted(set(outs))))
        if type(self.allow_unshared_scales) is not bool:
            raise BindError(
                f"allow_unshared_scales is {shown(self.allow_unshared_scales)}, expected True "
                "or False"
            )
        if type(self.mtp) is not bool:
            raise BindError(f"mtp is {shown(self.mtp)}, expected True or False")
        if self.progress is not None and type(self.progress) is not bool:
            raise BindError(f"progress is {shown(self.progress)}, expected True, False or None")

    def bind_kwargs(self) -> dict[str, Any]:
        """The keyword arguments ``runtime.bind.bind.bind_checkpoint`` takes for these options."""
        return {
            "quant_outputs": self.quant_output,
            "allow_unshared_scales": self.allow_unshared_scales,
            "progress": self.progress,
            "mtp": self.mtp,
        }


def _iterable(v: Any) -> Iterable[Any]:
    if not isinstance(v, (list, tuple, set, frozenset)):
        raise BindError(f"quant_output is {shown(v)}, expected a name or a list of names")
    return v
