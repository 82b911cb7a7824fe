"""Quantization scheme specs (``specs/schemes/*.yaml``): schema, then the semantic checks.

Invariants (each refusal a ``SpecError`` naming file, path and line):
- exactly one companion is the packed ``weight``, shaped ``[O, I / per_byte]`` (``[O, I]`` when
  unpacked); at most one companion per other role;
- the dequant formula agrees with the companions: the NVFP4 group is the block scale's ``I``
  divisor, an FP8 block is its ``(O, I)`` divisors, a ``multiply``/``divide`` global scale
  needs a ``global_scale`` companion;
- ``ceil`` is allowed only on a block scale (a rank's share is then whole blocks or refused);
- ``swizzle`` names the block scale; a scheme lives in ``schemes/<name>.yaml``;
- ``dequant_scaled`` (FP8 or int8 codes times one scale per row or per linear) has no group:
  its scale is ``[O, 1]`` or a scalar, and its codes' dtype is the weight's.
A scheme never names a model tensor: the schema admits no tensor names at all.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from specbind.core.quant import (
    CompanionRole,
    CompanionRule,
    DequantRule,
    DetectRule,
    DimRule,
    SchemeRule,
    canonical,
)
from specbind.generator.identifiers import validate_schema
from specbind.generator.yamlio import Located

_DIM = re.compile(
    r"^(?:(?P<ceil>ceil\()?(?P<of>[OI])(?: / (?:(?P<div>[0-9]+)|(?P<param>[A-Z])))?\)?"
    r"|(?P<one>1)|(?P<lit>[0-9]+))$"
)


def _dim(text: str) -> DimRule:
    m = _DIM.fullmatch(text)
    assert m is not None  # the schema's pattern admits only these forms
    if m["one"]:
        return DimRule("1")
    if m["lit"]:
        return DimRule("k", int(m["lit"]))
    of: Literal["O", "I"] = "O" if m["of"] == "O" else "I"
    if m["param"]:
        return DimRule(of, 0, bool(m["ceil"]), m["param"])
    return DimRule(of, int(m["div"] or 1), bool(m["ceil"]))


def _detect(raw: dict[str, Any], file: str = "") -> DetectRule:
    values = tuple(canonical(v) for v in raw["values"])
    return DetectRule(str(raw.get("file", file)), raw["field"], values)


def _listed(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [v]


def parse_scheme(doc: Located, stem: str) -> SchemeRule:
    validate_schema(doc, "scheme")
    d = doc.data
    if d["scheme"] != stem:
        raise doc.error(
            ("scheme",), f"scheme {d['scheme']!r} must live in schemes/{d['scheme']}.yaml"
        )
    packing = d["packing"]
    per_byte = int(packing.get("per_byte", packing.get("per_word", 1)))
    params = dict(d.get("params", {}))
    comps: list[CompanionRule] = []
    roles: dict[str, str] = {}
    for suffix, c in d["companions"].items():
        path = ("companions", suffix)
        role: CompanionRole = c["role"]
        if role in roles:
            raise doc.error((*path, "role"), f"role {role} is already {roles[role]!r}")
        roles[role] = suffix
        dims = tuple(_dim(t) for t in c["shape"])
        unknown = [x.param for x in dims if x.param and x.param not in params]
        if unknown:
            raise doc.error((*path, "shape"), f"{unknown[0]} is not one of the scheme's params")
        if any(x.ceil for x in dims) and role not in ("block_scale", "zero_point"):
            raise doc.error((*path, "shape"), "ceil is allowed only on a block scale or zero point")
        if role == "weight":
            want: tuple[DimRule, ...] = (
                (DimRule("O"), DimRule("I", per_byte))
                if per_byte > 1
                else (DimRule("O"), DimRule("I"))
            )
            if len(dims) == 3 and dims[2].of == "k":  # [O, I/(p·k), k]: the same bytes in blocks
                want = (DimRule("O"), DimRule("I", per_byte * dims[2].div), dims[2])
            if dims != want:
                raise doc.error(
                    (*path, "shape"),
                    f"the packed weight of {per_byte} element(s) per byte is "
                    f"[{', '.join(x.text for x in want)}]",
                )
        if role == "shape" and dims != (DimRule("k", 2),):
            raise doc.error((*path, "shape"), 'the linear\'s own shape is ["2"]: [O, I]')
        if any(x.of == "k" for x in dims[:-1]) or (
            role not in ("weight", "shape") and dims[-1:] and dims[-1].of == "k"
        ):
            raise doc.error((*path, "shape"), "a literal dim is only the packed weight's last")
        comps.append(
            CompanionRule(suffix, c["dtype"], dims, role, bool(c.get("activation", False)),
                          c.get("name", ""))
        )  # fmt: skip
    templated = {bool(c.template) for c in comps}
    if len(templated) > 1:
        raise doc.error(("companions",), "either every companion has a name template or none")
    if "weight" not in roles:
        raise doc.error(("companions",), "no companion has role: weight (the packed weight)")
    dq = d["dequant"]
    group = [g for g in dq.get("group", ()) if not isinstance(g, str)]
    named = [g for g in dq.get("group", ()) if isinstance(g, str)]
    if [g for g in named if g not in params]:
        raise doc.error(("dequant", "group"), f"{named[0]} is not one of the scheme's params")
    dequant = DequantRule(
        dq["op"], dq["codes"], tuple(int(g) for g in group), dq["global"], dq.get("scale", ""),
        named[0] if named else "",
    )  # fmt: skip
    _check_dequant(doc, dequant, {c.role: c for c in comps})
    swizzle = d.get("swizzle")
    if swizzle is not None and roles.get("block_scale") != swizzle:
        raise doc.error(("swizzle",), f"{swizzle!r} is not the scheme's block scale")
    ex = d["exclude"]
    return SchemeRule(
        name=d["scheme"],
        doc=d["doc"],
        detect=_detect(d["detect"]),
        weight_only=tuple(_detect(w) for w in _listed(d.get("weight_only", []))),
        exclude=DetectRule(ex["file"], ex["field"], ()),
        exclude_match=ex["match"],
        targets=d.get("targets"),
        companions=tuple(comps),
        per_byte=per_byte,
        order=d["packing"]["order"],
        dequant=dequant,
        swizzle=swizzle,
        variant=tuple(_detect(v, d["detect"]["file"]) for v in d.get("variant", ())),
        params=tuple(params.items()),
        symmetric=tuple(_detect(w) for w in _listed(d.get("symmetric", []))),
    )


def _check_dequant(doc: Located, dq: DequantRule, by_role: dict[str, CompanionRule]) -> None:
    scale = by_role.get("block_scale")
    if scale is None:
        raise doc.error(("companions",), "the dequant formula needs a block_scale companion")
    divs = tuple(x.div for x in scale.dims)
    if dq.op == "dequant_int_group":
        _check_int_group(doc, dq, by_role, scale)
        return
    if dq.op == "dequant_scaled":  # one scale per output row, or one per linear
        if dq.group or not (scale.scalar or scale.dims == (DimRule("O"), DimRule("1"))):
            raise doc.error(
                ("dequant", "group"),
                "dequant_scaled takes no group: its scale is [O, 1] (a channel) or [] / [1] "
                f"(a tensor), not {scale.shape_text}",
            )
        weight = by_role["weight"]
        want = {"e4m3": "F8_E4M3", "int8": "I8"}.get(dq.codes)
        if weight.dtype != want:
            raise doc.error(
                ("dequant", "codes"), f"{dq.codes} codes are stored as {want}, not {weight.dtype}"
            )
        if dq.global_op != "none":
            raise doc.error(("dequant", "global"), "dequant_scaled has no global scale")
        return
    if dq.op == "dequant_mxfp4" and (dq.scale != "e8m0" or scale.dtype != "U8"):
        raise doc.error(("dequant", "scale"), "MXFP4 block scales are E8M0 bytes (scale: e8m0, U8)")
    if dq.op in ("dequant_nvfp4", "dequant_mxfp4"):
        if len(dq.group) != 1 or divs != (1, dq.group[0]):
            raise doc.error(
                ("dequant", "group"),
                f"an NVFP4 group of {list(dq.group)} needs the block scale [O, I / group], "
                f"not {scale.shape_text}",
            )
    elif len(dq.group) != 2 or divs != dq.group:
        raise doc.error(
            ("dequant", "group"),
            f"an FP8 block of {list(dq.group)} needs the block scale [ceil(O / b0), ceil(I / b1)], "
            f"not {scale.shape_text}",
        )
    if (dq.global_op != "none") != ("global_scale" in by_role):
        raise doc.error(
            ("dequant", "global"),
            f"global: {dq.global_op} and the companions disagree on a global_scale",
        )


def _check_int_group(
    doc: Located, dq: DequantRule, by_role: dict[str, CompanionRule], scale: CompanionRule
) -> None:
    """Unsigned integer codes in int32 words: the weight ``[O, I / (32 / bits)]`` I32, the
    scale ``[O, I / G]`` (a group) or ``[O, 1]`` (a channel), a zero point (if any) packed as
    the codes along O and grouped as the scale along I."""
    weight = by_role["weight"]
    per = 32 // dq.bits if dq.bits in (4, 8) else 0
    if not per or weight.dtype != "I32" or weight.dims != (DimRule("O"), DimRule("I", per)):
        raise doc.error(
            ("dequant", "codes"),
            f"{dq.codes} codes are stored as I32 [O, I / {per or '32/bits'}], not "
            f"{weight.dtype} {weight.shape_text}",
        )
    if scale.dims[:1] != (DimRule("O"),) or len(scale.dims) != 2 or scale.dims[1].of not in "I1":
        raise doc.error(
            ("dequant", "group"), f"the scale is [O, I / G] or [O, 1], not {scale.shape_text}"
        )
    zero = by_role.get("zero_point")
    if zero is not None and zero.dims != (DimRule("O", per, True), scale.dims[1]):
        raise doc.error(
            ("dequant", "group"),
            f"the zero point is packed as the codes along O and grouped as the scale: "
            f"[ceil(O / {per}), {scale.dims[1].text}], not {zero.shape_text}",
        )
    if dq.global_op != "none":
        raise doc.error(("dequant", "global"), "dequant_int_group has no global scale")
