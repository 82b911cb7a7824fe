"""Which linear rules of one block, in one layer, the checkpoint stores quantized: the
``LayerQuant`` that binding (``runtime.binder.quant``) takes, made from the checkpoint's
quantization config (``runtime.quant.scheme``).

Invariants: the config decides, never the dtypes; an excluded module that carries a companion,
a quantized one that carries none, and a stacked family whose members disagree are each refused
naming the module, so the config and the tensors never silently disagree.
Trap: the names the config lists are the checkpoint's own stored names (``on_disk``), before
any rename the model spec declares; a rule's pattern is matched member by member.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from specbind.core.errors import BindError, at
from specbind.core.ir import TensorRule
from specbind.runtime.binder.quant import LayerQuant, module_of, stored_module
from specbind.runtime.quant.scheme import QuantConfig


def layer_quant(
    q: QuantConfig | None,
    rules: Sequence[TensorRule],
    names: Sequence[str],
    full: str,
    counts: Mapping[str, int],
    layer: int,
    on_disk: Callable[[str], str] | None = None,
    outputs: frozenset[str] = frozenset(),
    allow_unshared: bool = False,
    aliases: Callable[[str], list[str]] = lambda _: [],
) -> LayerQuant | None:
    """Which linear rules of a block the config quantizes in one layer (``full``: the layer's
    full-name prefix; ``on_disk``: a full name's stored name, which the config lists)."""
    if q is None:
        return None
    present = set(names)
    extra = [c.suffix for c in q.scheme.companions if c.role != "weight"]
    quantized: set[str] = set()
    for r in rules:
        if not r.linear:
            continue
        idx = range(counts[r.family]) if r.family is not None else [None]
        says: dict[bool, list[int]] = {True: [], False: []}
        for i in idx:
            name = r.name if i is None else r.concrete(i).name
            stored = q.scheme.weight.stored_name(name) if q.scheme.weight.template else name
            if stored not in present:
                continue  # an absent optional group (a shared DSA layer's indexer): not stored
            module = module_of(name)
            disk = stored_module(on_disk(full + name) if on_disk else full + name, q.scheme)
            yes = q.quantized(disk, aliases(disk))
            if yes and not q.scheme.holds(r.linear_axes is not None):
                raise BindError(
                    f"{at(layer)}: {name}: {q.scheme.name} stores it, but binds "
                    f"{'only stacked linears' if q.scheme.weight.template else 'no stacked linear'}"
                    " so far; refused rather than bound partly"
                )
            says[yes].append(-1 if i is None else i)
            carried = [
                n for c in q.scheme.companions
                if c.role != "weight" and (n := c.stored_name(name)) in present
            ]  # fmt: skip
            if not yes and carried:
                raise BindError(
                    f"{at(layer)}: {module} is excluded from quantization "
                    f"({q.why_excluded(disk)}), but carries {carried} — refused: "
                    "its config and its tensors disagree"
                )
            if yes and not carried and extra:
                raise BindError(
                    f"{at(layer)}: {module}: {q.source} leaves it quantized "
                    f"({q.scheme.name}), but none of its {extra} is stored — refused: its "
                    "config and its tensors disagree"
                )
        if says[True] and says[False]:
            raise BindError(
                f"{at(layer)}: {r.name}: the config quantizes members {says[True]} and "
                f"excludes {says[False]}; a stacked family has one layout"
            )
        if says[True]:
            quantized.add(r.name)
    if not quantized:
        return None
    axes = tuple((r.name, r.linear_axes) for r in rules if r.linear_axes and r.name in quantized)
    return LayerQuant(
        q.scheme, q.weight_only, frozenset(quantized), outputs, allow_unshared, axes=axes
    )
