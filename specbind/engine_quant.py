"""Quantized checkpoints in an engine's own parameters: which schemes the engine serves, and the
engine's name and dtype of each companion bound beside a quantized linear.

The scheme layouts (``specs/engines/<engine>/schemes/<scheme>.yaml``, generated into
``generated.engines.SCHEMES``) say how the engine holds a scheme; the naming is the scheme's
own: an engine parameter ``<module>.weight`` of a quantized field is replaced by one parameter
per companion, named as the scheme stores that companion beside the parameter
(``CompanionRule.stored_name``: ``<module>.weight``, ``<module>.weight_scale``, or
compressed-tensors' ``<module>.weight_packed``), filled from the companion field the bind
joined and split as the field is (``qkv_proj_weight_scale``: this rank's q, k and v rows).

Invariants:
- a quantized checkpoint binds for an engine only under a scheme layout of that engine; a
  scheme with none, or one the engine's own loader cannot load (``unavailable:``, measured),
  or a companion the layout refuses (static inputs where the engine cannot run them), is
  refused in one line naming the scheme, before any tensor is read;
- a tp the scheme layout's proof does not cover is refused; a model it does not prove binds
  with a warning (as an unproven engine layout does);
- a companion is widened only where its scheme layout says the engine's parameter is wider
  (``dtype: F32`` over a BF16 or F16 companion: exact, what the engine's ``copy_`` does), and
  a fused linear holds one partner's only where it says ``fused: last`` (vLLM's
  ``weight_shape``: each partner's load overwrites the whole parameter);
- a quantized field the engine would pad, split whole, compute on, or stack as experts has no
  companion layout here: refused naming the field, never bound half-quantized.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbind.core.errors import BindError
from specbind.engine_ops import check_proven_tp

_LOG = logging.getLogger("specbind.engine")


@dataclass(frozen=True)
class EngineScheme:
    """How an engine holds one scheme's companions in this checkpoint (its variant)."""

    scheme: Any  # the SchemeRule
    companions: tuple[Any, ...]  # the CompanionRules this checkpoint stores, weight first
    dtypes: dict[str, str]  # suffix -> the engine's dtype where wider than stored
    last: frozenset[str] = frozenset()  # suffixes a fused linear holds of its last partner

    def engine_names(self, param: str) -> dict[str, str]:
        """Companion suffix -> the engine's parameter name, for a quantized linear whose
        unquantized engine parameter is ``param`` (``<module>.weight``)."""
        return {c.suffix: c.stored_name(param) for c in self.companions}


def engine_scheme(engine: str, layout: Any, raw: Any, tp_size: int | None) -> EngineScheme | None:
    """The checkpoint's scheme as ``engine`` holds it, or None for an unquantized checkpoint;
    refused in one line where the engine does not serve it (see the invariants; ``tp_size``
    None: any tp, for a check made before the tp is known)."""
    from specbind.generated.engines import SCHEMES, SCHEMES_UNAVAILABLE
    from specbind.runtime.quant.scheme import detect

    qconf = detect(raw, layout.table.schemes)
    if qconf is None:
        return None
    name = qconf.scheme.name
    where = f"specs/engines/{engine}/schemes/{name}.yaml"
    why = SCHEMES_UNAVAILABLE.get((engine, name))
    if why is not None:
        raise BindError(f"{engine} cannot load {name} checkpoints here ({where}: {why})")
    entry = SCHEMES.get((engine, name))
    if entry is None:
        served = sorted(s for e, s in SCHEMES if e == engine)
        raise BindError(
            f"{engine}: the checkpoint is quantized as {name}, which no {engine} scheme layout "
            f"describes ({where}; {engine} serves: {', '.join(served) or 'none'})"
        )
    companions = qconf.scheme.companions_for(qconf.weight_only)
    for c in companions:
        if c.suffix in entry["refused"]:
            raise BindError(
                f"{engine}: the {name} checkpoint stores {c.suffix}, which {engine} does not "
                f"serve here ({where}: {entry['refused'][c.suffix]})"
            )
    if tp_size is not None:  # the model layouts' rule: proven at tp 1 and 2 holds above
        check_proven_tp(engine, f"{name} checkpoints", where, tuple(entry["tp"]), tp_size)
    if layout.model not in entry["models"]:
        _LOG.warning(
            "specbind: %s checkpoints of %s are unproven in %s: %s proves models %s only",
            name, layout.model, engine, entry["test"], ", ".join(entry["models"]),
        )  # fmt: skip
    weight = qconf.scheme.weight
    ordered = (weight, *(c for c in companions if c is not weight))
    return EngineScheme(qconf.scheme, ordered, dict(entry["dtypes"]), frozenset(entry["last"]))


def made_by_engine(engine: str, path: Any, names: Any) -> frozenset[str]:
    """Of the engine's parameter ``names``, those its quantization method makes and its loader
    fills from no tensor of the checkpoint at ``path`` (the scheme layout's ``made_by_engine``):
    left as the engine made them (``fill(left=)``), never donated to the bind. None for an
    unquantized checkpoint or a scheme the engine does not serve (the bind refuses that)."""
    from specbind.api import model_table
    from specbind.engine_select import select_layout
    from specbind.generated.engines import SCHEMES
    from specbind.runtime.io.checkpoint import CheckpointDir
    from specbind.runtime.quant.scheme import detect

    raw = CheckpointDir(Path(path))
    layout = select_layout(engine, model_table(None, "model=", raw.config, None).name, raw.config)
    qconf = detect(raw, layout.table.schemes)
    entry = None if qconf is None else SCHEMES.get((engine, qconf.scheme.name))
    if entry is None:
        return frozenset()
    ends = tuple("." + m for m in entry["made"])
    return frozenset(n for n in names if n.endswith(ends))


def companion_params(
    engine: str, quant: EngineScheme | None, layout: Any, block: str,
    names: Mapping[str, str], arrays: Mapping[str, Any], fields: Mapping[str, Any],
) -> dict[str, tuple[str, str]]:  # fmt: skip
    """Bound field -> (the engine parameter it fills, the companion's suffix or "" for a field
    that is no companion) for one slot, ``names`` the layout's field -> parameter of its block.

    A field ``F`` is quantized where its companions ``F_<suffix>`` were bound beside it; its
    packed weight and each companion then fill ``stored_name(names[F])``; with no ``quant``
    every field is its own parameter."""
    out: dict[str, tuple[str, str]] = {}
    extra = {c.suffix for c in quant.companions[1:]} if quant is not None else set()
    for field in arrays:
        if field in out:
            continue
        if field not in names:
            base = next(
                (f for f in names for s in extra if field == f"{f}_{s}" and f in arrays), None
            )
            if base is None:
                raise BindError(
                    f"{engine}: bound field {block}.{field} has no engine parameter in the "
                    f"{engine} layout of {layout.model}"
                )
            continue  # named with its packed field, below
        quantized = [f"{field}_{s}" for s in extra if f"{field}_{s}" in arrays]
        if not quantized or quant is None:
            out[field] = (names[field], "")
            continue
        param = names[field]
        refuse = _unlaid(layout, block, field, fields[field], param)
        if refuse:
            raise BindError(
                f"{engine}: {block}.{field} is stored as {quant.scheme.name}, and the {engine} "
                f"layout of {layout.model} {refuse}: its companions have no layout there"
            )
        eng = quant.engine_names(param)
        out[field] = (eng[quant.scheme.weight.suffix], quant.scheme.weight.suffix)
        for c in quant.companions[1:]:
            key = f"{field}_{c.suffix}"
            if key in arrays:
                out[key] = (eng[c.suffix], c.suffix)
    return out


def _unlaid(layout: Any, block: str, field: str, rule: Any, param: str) -> str:
    """Why the engine's parameter of quantized ``field`` has no companion layout, or ""."""
    if rule.family is not None:
        return f"stacks it as experts ({param!r})"
    if not param.endswith(".weight"):
        return f"names it {param!r}, not <module>.weight"
    if field in layout.padding.get(block, {}):
        return "pads or splits it whole"
    if field in layout.values.get(block, {}):
        return "computes on its values"
    if field in layout.first_rank.get(block, ()):
        return "holds it on rank 0 alone"
    return ""


def engine_companion(
    quant: EngineScheme, suffix: str, dtype: str, arr: Any, name: str
) -> tuple[str, Any]:
    """A companion as the engine holds it: a fused linear's last partner's alone where the
    scheme layout says so (the bind joins one per partner: ``[parts, ...]``), widened where it
    says so."""
    from specbind.engine_ops import apply_values

    if suffix in quant.last:
        c = next(c for c in quant.companions if c.suffix == suffix)
        if arr.ndim > len(c.dims):  # joined one per partner: the last one loaded stays
            arr = arr[-1]
    want = quant.dtypes.get(suffix)
    if want is None or want == dtype:
        return dtype, arr
    return want, apply_values(arr, (), want, name)  # BF16/F16 -> F32: exact
