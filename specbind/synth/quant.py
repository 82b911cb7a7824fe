"""What ``specbind synth --quant SCHEME`` writes: each linear weight stored as the scheme's
companions, and the config file the scheme is detected by.

Generic: the linears are the block rules marked ``linear: true``, the companions and their
shapes come from the scheme, and the config fields are the ones the scheme reads (its
``detect`` field and each ``variant`` field set to its first value, its exclude list, its
targets). A linear whose
``[O, I]`` the scheme cannot store in whole groups (``I % 16 != 0`` for NVFP4) is written in
BF16 and listed as excluded by its full module name, so the checkpoint is one a real tool
could have written.
Invariants: a global or input scale is one value per checkpoint (see ``synth._values``), so
the scales a block declares shared agree; every scale is a positive finite value whose product
with any code is a finite BF16 (an E8M0 block scale is a byte in ``E8M0_BYTES``, never the NaN
byte 0xFF nor a power of two that overflows), so every written checkpoint dequantizes finite.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from specbind.core.patterns import member_of
from specbind.core.quant import CompanionRule, DetectRule, SchemeRule
from specbind.runtime.binder.checks import Array
from specbind.runtime.binder.tables import BlockEntry

Companion = tuple[CompanionRule, int, int]  # a companion's rule and its linear's O and I
# E8M0 block scales written: 2^-8 .. 2^0, the range real MXFP4 weights use (never 0xFF, NaN)
E8M0_BYTES = (119, 128)


def quantized_entries(
    block: BlockEntry[Any],
    written: list[tuple[str, str, tuple[int, ...]]],
    scheme: SchemeRule,
    pre: str,
    excluded: list[str],
    roles: dict[str, Companion] | None = None,
) -> list[tuple[str, str, tuple[int, ...]]]:
    """``written`` (layer-relative names) with every storable linear replaced by companions;
    the others are appended to ``excluded`` as full module names (``pre``: the layer prefix).
    ``roles`` gets each companion's full name and rule, for ``companion_values``."""
    linear = [r for r in block.tensors if r.linear]
    out: list[tuple[str, str, tuple[int, ...]]] = []
    for name, dtype, shape in written:
        rule = next((r for r in linear if member_of(name, r.name)), None)
        if rule is None:
            out.append((name, dtype, shape))
            continue
        axes = rule.linear_axes  # a stacked linear [E, I, O]: companions [E, O, ...]
        o, i = (shape[0], shape[1]) if axes is None else (shape[axes[1]], shape[axes[0]])
        lead = () if axes is None else shape[:1]
        module = name.removesuffix(".weight")
        exact = all(d.exact(o, i) for c in scheme.companions for d in c.dims)
        if not exact or not scheme.holds(axes is not None):
            excluded.append(pre + module)
            out.append((name, dtype, shape))
            continue
        for c in scheme.companions:  # the packed weight under its stored suffix too
            stored = c.stored_name(name) if c.template else f"{module}.{c.suffix}"
            out.append((stored, c.dtype, (*lead, *c.shape(o, i))))
            if roles is not None:
                roles[pre + stored] = (c, o, i)
    return out


def companion_values(
    rng: np.random.Generator, comp: Companion, scheme: SchemeRule, shape: tuple[int, ...]
) -> Array | None:
    """The values of an E8M0 block scale (``scheme.dequant.scale``), bytes in ``E8M0_BYTES``;
    None for any other companion, whose values ``synth._values`` writes (finite and, for a
    scale, positive and small)."""
    c, o, i = comp
    if c.role == "shape":  # the linear's own shape, as the packed weight's is checked against
        return np.array([o, i], dtype=np.int64)
    if c.role == "block_scale" and scheme.dequant.scale == "e8m0":
        return rng.integers(*E8M0_BYTES, size=shape, dtype=np.uint8)
    return None


def _put(doc: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``dotted`` in ``doc`` (``*`` becomes ``group_0``, as compressed-tensors names it)."""
    parts = [("group_0" if p == "*" else p) for p in dotted.split(".")]
    for p in parts[:-1]:
        doc = doc.setdefault(p, {})
    doc[parts[-1]] = value


def _value(rule: DetectRule) -> Any:
    """The rule's first value as the config holds it (``8``, ``[128, 128]``, ``null``: JSON;
    anything else a string)."""
    v = rule.values[0]
    try:
        return json.loads(v)
    except ValueError:
        return v


SYNTH_PARAM = 32  # every param a synthesized checkpoint's config sets (the group size)


def as_written(scheme: SchemeRule) -> SchemeRule:
    """The scheme as the config ``quant_config_files`` writes sets it: each param
    ``SYNTH_PARAM``, symmetric where the scheme can be (no zero point)."""
    if not scheme.params and not scheme.symmetric:
        return scheme
    return scheme.resolved({n: SYNTH_PARAM for n, _ in scheme.params}, bool(scheme.symmetric))


def quant_config_files(scheme: SchemeRule, excluded: list[str]) -> dict[str, dict[str, Any]]:
    """The config documents by file name (``config.json`` fields to merge in)."""
    files: dict[str, dict[str, Any]] = {}
    for _, dotted in scheme.params:
        _put(files.setdefault(scheme.detect.file, {}), dotted, SYNTH_PARAM)
    for w in scheme.symmetric[:1]:
        _put(files.setdefault(w.file, {}), w.field, _value(w))
    _put(files.setdefault(scheme.detect.file, {}), scheme.detect.field, _value(scheme.detect))
    for v in scheme.variant:
        _put(files.setdefault(v.file, {}), v.field, _value(v))
    _put(files.setdefault(scheme.exclude.file, {}), scheme.exclude.field, list(excluded))
    if scheme.targets is not None:
        _put(files.setdefault("config.json", {}), scheme.targets, ["Linear"])
    return files
