"""Quantization schemes in the IR: what replaces a linear weight ``[O, I]`` on disk.

A scheme (``specs/schemes/*.yaml``) names no model tensor. It says how a checkpoint announces
it (a config file field, and every ``variant`` field that tells it from its family's other
variants), which modules it leaves out (a config list), the packed weight that takes the
linear weight's place, the companion tensors beside it with shapes in terms of the linear's
``O`` and ``I``, and the declared dequant formula.

Invariants:
- every companion dim is ``O`` or ``I`` divided by a whole ``div`` (``ceil`` allowed only for
  block scales and zero points), or the literal ``1``; a scalar is ``[]``; a ``div`` may be a
  param the checkpoint's config sets (``I / G``), 0 until ``SchemeRule.resolved`` sets it at
  detection, so a scheme with params is never planned before it is resolved;
- a companion splits across tp with its linear: the rank's ``[O_r, I_r]`` window divided by
  ``div`` on each axis, which must be whole (``(I / tp) % 16 == 0`` for NVFP4 columns), so a
  rank holds whole groups and reads only its own bytes; a dim that does not follow ``O`` or
  ``I`` (a scalar, a literal 1) is replicated;
- the packed weight is one of the companions (``role: weight``); its ``suffix`` may differ
  from ``weight`` (compressed-tensors writes ``weight_packed``); where the config says the
  codes are symmetric, ``resolved`` drops the ``zero_point`` companion.
Trap: ``div`` on the packed weight's ``I`` is elements per byte, not a group size; both are
"whole units" of the same column window, so one rule serves both.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from specbind.core.record import record, replace

# zero_point: unsigned codes packed like the weight's, one per group (absent: symmetric, the
# zero is the codes' midpoint 2^(bits-1)); shape: the linear's own [O, I], checked, as stored
CompanionRole = Literal[
    "weight", "block_scale", "global_scale", "input_scale", "zero_point", "shape"
]
GlobalOp = Literal["multiply", "divide", "none"]
# glob_prefix: a glob that names a module excludes everything under it too (gpt-oss's
# ``model.layers.*.self_attn`` excludes its q_proj), as transformers reads the list.
ExcludeMatch = Literal["glob", "glob_prefix", "compressed_tensors"]


@record
class DimRule:
    """One companion dim: ``of`` (O, I or a literal 1) divided by ``div``, rounded up if
    ``ceil``."""

    of: Literal["O", "I", "1", "k"]  # k: the literal ``div`` (MXFP4's 16 bytes of a block)
    div: int = 1
    ceil: bool = False
    # a divisor the checkpoint's config gives (``I / G``, G a scheme param): ``div`` is 0 until
    # ``SchemeRule.resolved`` sets it from the config
    param: str = ""

    def size(self, o: int, i: int) -> int:
        if self.of == "1":
            return 1
        if self.of == "k":
            return self.div
        n = o if self.of == "O" else i
        return -(-n // self.div) if self.ceil else n // self.div

    def exact(self, o: int, i: int) -> bool:
        """True when ``O`` or ``I`` splits into whole ``div`` units (always, with ``ceil``)."""
        if self.of in ("1", "k") or self.ceil:
            return True
        return (o if self.of == "O" else i) % self.div == 0

    @property
    def text(self) -> str:
        if self.of == "k":
            return str(self.div)
        if self.param and not self.div:
            return f"{self.of} / {self.param}"
        if self.of == "1" or self.div == 1:
            return self.of
        return f"ceil({self.of} / {self.div})" if self.ceil else f"{self.of} / {self.div}"


@record
class CompanionRule:
    suffix: str  # the tensor's name is the linear's module name + "." + suffix
    dtype: str
    dims: tuple[DimRule, ...]  # () is a scalar
    role: CompanionRole
    activation: bool = False  # absent from weight-only checkpoints
    template: str = ""  # "{param}_blocks": named from the parameter, not "<module>.<suffix>"

    def stored_name(self, param: str) -> str:
        """This companion's name for the linear parameter ``param`` (rule name)."""
        if self.template:
            return self.template.replace("{param}", param)
        return f"{param.removesuffix('.weight')}.{self.suffix}"

    @property
    def shape_text(self) -> str:
        return "[" + ", ".join(d.text for d in self.dims) + "]"

    @property
    def scalar(self) -> bool:
        """One value per linear (``[]``, ``[1]``, or the linear's own shape ``[2]``): no dim
        follows O or I; replicated, and joined one per source."""
        return all(d.of in ("1", "k") for d in self.dims)

    def shape(self, o: int, i: int) -> tuple[int, ...]:
        return tuple(d.size(o, i) for d in self.dims)


def canonical(v: Any) -> str:
    """A config value as scheme files compare it: a string as is, anything else as compact
    JSON (``8``, ``true``, ``null``, ``[128, 128]``), so YAML's ``8`` and JSON's ``8`` meet."""
    if isinstance(v, str):
        return v
    return json.dumps(v, separators=(", ", ": "), sort_keys=True, default=str)


@record
class DetectRule:
    """``file``'s ``field`` (dotted; ``*`` is any key) holds one of ``values``: each a config
    value's canonical text (``runtime.quant.scheme.canonical``: ``8``, ``true``, ``null``,
    ``[128, 128]``)."""

    file: str
    field: str
    values: tuple[str, ...]


@record
class DequantRule:
    """The declared dequant formula, carried out by the ``Ops`` method ``op``."""

    op: Literal[
        "dequant_nvfp4", "dequant_fp8_block", "dequant_mxfp4", "dequant_scaled", "dequant_int_group"
    ]
    codes: str  # e2m1 | e4m3 | int8 | uint4 | uint8 (unsigned codes in int32 words)
    group: tuple[int, ...]  # (16,) along I, a (rows, cols) block; () for dequant_scaled
    global_op: GlobalOp  # how the global scale enters: W = code * scale (* or /) global
    scale: str = ""  # the block scale's format where its dtype does not say it: e8m0
    group_param: str = ""  # the scheme param that is the group (``G``), set by ``resolved``

    @property
    def bits(self) -> int:
        """The width of an unsigned integer code (``uint4``: 4), 0 for other codes."""
        return int(self.codes[4:]) if self.codes.startswith("uint") else 0


@record
class SchemeRule:
    name: str
    doc: str
    detect: DetectRule
    # the fields and values that mean no activation scales (any one of them holding)
    weight_only: tuple[DetectRule, ...]
    exclude: DetectRule  # where the excluded modules are listed (values unused)
    exclude_match: ExcludeMatch
    targets: str | None  # compressed-tensors: the config field listing quantized targets
    companions: tuple[CompanionRule, ...]
    # packed elements per stored element of the weight (1: not packed; 2: two E2M1 codes a
    # byte; 8: eight 4-bit codes an int32 word)
    per_byte: int
    order: Literal["low_first", "none"]
    dequant: DequantRule
    swizzle: str | None = None  # the block scale a CUTLASS swizzled output is made from
    # every field that tells this scheme from its family's other variants: each value found
    # there (an absent field reads as ``null``) is one of the rule's values
    variant: tuple[DetectRule, ...] = ()
    # a divisor read from the config: (name, dotted field in the detect file), ``I / G``
    params: tuple[tuple[str, str], ...] = ()
    # where the config says the codes are symmetric (any one rule holding): no zero point
    symmetric: tuple[DetectRule, ...] = ()
    # what ``resolved`` set: each param's value, and whether the zero point was dropped
    values: tuple[tuple[str, int], ...] = ()
    sym: bool = False

    @property
    def weight(self) -> CompanionRule:
        return next(c for c in self.companions if c.role == "weight")

    def resolved(self, values: dict[str, int], sym: bool = False) -> SchemeRule:
        """This scheme as one checkpoint's config sets it: each param divisor (``I / G``) and
        the dequant group from ``values`` (param -> its whole value), and with ``sym`` no
        zero point (the codes' midpoint is the zero)."""

        def dim(d: DimRule) -> DimRule:
            return replace(d, div=values[d.param]) if d.param else d

        comps = tuple(
            replace(c, dims=tuple(dim(d) for d in c.dims))
            for c in self.companions
            if not (sym and c.role == "zero_point")
        )
        dq = self.dequant
        if dq.group_param:
            dq = replace(dq, group=(values[dq.group_param],))
        return replace(
            self, companions=comps, dequant=dq, values=tuple(sorted(values.items())), sym=sym
        )

    def role(self, role: CompanionRole) -> CompanionRule | None:
        return next((c for c in self.companions if c.role == role), None)

    def holds(self, stacked_linear: bool) -> bool:
        """Whether the scheme stores this kind of linear: companions named from the parameter
        (``{param}_blocks``) are bound for stacked linears (``linear: {in, out}``) only, and
        ``<module>.<suffix>`` companions for ``[O, I]`` ``MODULE.weight`` linears only."""
        return stacked_linear == bool(self.weight.template)

    def companions_for(self, weight_only: bool) -> tuple[CompanionRule, ...]:
        return tuple(c for c in self.companions if not (weight_only and c.activation))


def window(dim: DimRule, full: int, local: int, offset: int) -> tuple[int, int, int] | None:
    """(full, local, offset) of a companion dim for a rank holding ``local`` elements of the
    linear's axis at ``offset``; None when the rank's window is not whole ``div`` units."""
    if dim.of in ("1", "k"):
        return (dim.size(0, 0), dim.size(0, 0), 0)
    if local == full:
        return (dim.size(full, full), dim.size(full, full), 0)
    if local % dim.div or offset % dim.div:
        return None
    return (math.ceil(full / dim.div) if dim.ceil else full // dim.div, local // dim.div,
            offset // dim.div)  # fmt: skip
