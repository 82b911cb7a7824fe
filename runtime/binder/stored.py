"""How a refusal names a tensor: by the name the checkpoint's own index uses, in full, with
where the spec's tensor sits inside it.

A binder reads tensors under the specs' names, layer-relative (``mlp.experts.4.gate_proj.weight``);
the checkpoint may store them otherwise (``model.layers.3.block_sparse_moe.experts.4.w1.weight``,
a name map's rename), as a row section of a fused tensor (Falcon's
``self_attention.query_key_value.weight``), or as one member of a stacked one (GraniteMoE's
``block_sparse_moe.input_linear.weight``). A source that knows (``NamedView`` and the layer
and model-level sources over it) answers ``stored(name)`` with a ``Stored``; ``label`` words
it for a message, ``Stored.index`` puts an element's index in the stored tensor's
coordinates.

Invariants:
- a label always begins with the full stored name, so the user finds it in
  ``model.safetensors.index.json``; the spec's name follows only as ``read as <name>``, and
  only where it differs from the stored one;
- for a name the checkpoint lacks, ``stored`` gives the name it would be stored under (the
  renames this checkpoint's own names use, read backwards), so a "missing" refusal names
  what the user would look for;
- a source without ``stored`` (an in-memory ``DictSource``) names a tensor as it is given.
Trap: labels are built only when a refusal is raised; nothing here runs on a bind that
succeeds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, SupportsInt

from specbind.core.record import record


@record
class Stored:
    """Where a name the specs use lies in the checkpoint."""

    name: str  # the full stored name (for an absent tensor: the name it would have)
    read_as: str | None = None  # the specs' name, where it differs from the stored one
    member: int | None = None  # its member of a stacked [members, ...] stored tensor
    row: int | None = None  # its first row in the stored tensor (or member): a row section
    shape: tuple[int, ...] | None = None  # the stored tensor's shape, for a section or member

    def label(self) -> str:
        """``model.layers.1.self_attn.qkv_proj.weight (its rows from 32 of [64, 32], read as
        self_attn.k_proj.weight)``; the stored name alone where nothing is renamed."""
        if self.read_as is None:
            return self.name
        where = [] if self.member is None else [f"member {self.member}"]
        if self.row is not None:
            where.append(f"its rows from {self.row}")
        if where and self.shape is not None:
            where[-1] += f" of {list(self.shape)}"
        return f"{self.name} ({', '.join([*where, f'read as {self.read_as}'])})"

    def index(self, local: Sequence[SupportsInt]) -> list[int]:
        """``local`` (an index of the tensor the specs read) in the stored tensor's
        coordinates: a section's first row added on axis 0, a member's index leading."""
        out = [int(i) for i in local]
        if self.row is not None and out:
            out[0] += self.row
        return out if self.member is None else [self.member, *out]


def stored(src: Any, name: str) -> Stored:
    """Where ``name`` of ``src`` lies in the checkpoint (as given when ``src`` cannot say)."""
    where = getattr(src, "stored", None)
    got = where(name) if where is not None else None
    return got if isinstance(got, Stored) else Stored(name)


def label(src: Any, name: str) -> str:
    """``name`` as a refusal words it: the stored tensor first (see ``Stored.label``)."""
    return stored(src, name).label()


def stored_name(src: Any, name: str) -> str:
    """``name``'s full stored name alone (see ``Stored.name``)."""
    return stored(src, name).name


def stored_names(src: Any, names: Iterable[str]) -> list[str]:
    """The stored names of ``names``, in order, each once (three sections of one fused tensor
    are one stored tensor): what a list in a refusal shows."""
    out: dict[str, None] = {}
    for n in names:
        out[stored(src, n).name] = None
    return list(out)
