"""Finite values: a quantized linear binds only if its dequant, the scheme's declared formula,
is finite wherever its stored codes are (a field is finite unless the stored values are).

What is refused, in one line naming the stored tensor, its first offending index (in the
whole tensor's coordinates) and the offending byte or value:
- a non-finite stored scale: an E8M0 byte 0xFF (NaN, OCP MX v1.0 5.4.1), an F8_E4M3 NaN
  (0x7F, 0xFF), an F32 or BF16 NaN or Inf in a block, global or input scale;
- an effective group scale that is not finite (NVFP4: ``scale / global`` with a zero global,
  or ``scale * global`` past F32), which makes every value of its group NaN or Inf;
- an overflow: a finite code times its finite scale past BF16's largest value (the declared
  output is BF16), e.g. E8M0 0xFE (2^127) times the E2M1 code 6.0.
What is allowed: a stored non-finite code (an FP8 E4M3 weight NaN) stays NaN, as a widening
of a stored BF16 NaN stays NaN (``runtime.binder.checks``): those are the stored values.

Cost: one pass over the scales (a 16th of MXFP4's bytes, an 8th of NVFP4's, a 16384th of
FP8-block's); the codes are read only in the groups whose scale times the largest code could
overflow (none in a real checkpoint), so no dequantized copy is made here.

One verdict: the scales of a tensor whose whole is at most ``WHOLE_CHECK_BYTES`` are checked
whole on every rank (the suspect groups' codes read from the whole tensor too, counted in
``BindReport.verdict_bytes``), so every tp rank refuses the same element or none does. A
bigger scale tensor is checked on this rank's share only; the index is still the whole
tensor's. Trap: each rank checks the family members it holds (an ep rank never reads another
rank's experts' scales), so a bad expert is refused by the ranks that bind it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import ml_dtypes
import numpy as np

from specbind.core.dtypes import DTYPES
from specbind.core.errors import BindError, at
from specbind.core.patterns import fill, index_of, member_of, parts
from specbind.core.planning import BlockPlan, TensorPlan
from specbind.runtime.binder.checks import WHOLE_CHECK_BYTES, Array, BindReport, stored
from specbind.runtime.binder.quant import LayerQuant
from specbind.runtime.binder.quant_numerics import (
    E2M1_MAGNITUDES,
    dequant_int_group,
    dequant_scaled,
    e4m3_to_f32,
    row_scales,
)
from specbind.runtime.io.source import TensorSource, WholeSource

F32 = np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E2M1_MAX = max(E2M1_MAGNITUDES)
E4M3_MAX = float(np.array(0x7E, np.uint8).view(E4M3))  # 448.0
# A group whose |scale| times its format's largest code is at most half of BF16's largest
# value cannot overflow (one F32 rounding and one BF16 rounding add far less than a factor 2):
# only the others have their codes read.
SAFE = float(np.array(0x7F7F, np.uint16).view(BF16)) / 2  # BF16's largest: 3.39e38
# the smallest E8M0 byte whose power of two times 6.0 passes SAFE
MX_SUSPECT = next(s for s in range(256) if math.ldexp(E2M1_MAX, s - 127) > SAFE)
# |E2M1| of each byte's low and high nibble (the even column, then the odd one): F32 [256, 2]
NIBBLES = np.array(
    [[E2M1_MAGNITUDES[b & 7], E2M1_MAGNITUDES[(b >> 4) & 7]] for b in range(256)], F32
)
Index = tuple[int, ...]


def check_finite(
    layer: int,
    host: Mapping[str, Array],
    plan: BlockPlan,
    lq: LayerQuant | None,
    *,
    src: TensorSource,
    report: BindReport,
) -> None:
    """Refuse this rank's quantized linears whose dequant is not finite where the codes are
    (the module docstring says what is refused and how far the verdict reaches)."""
    if lq is None:
        return
    for pat in sorted(lq.quantized):
        wp = lq.name(pat, lq.scheme.weight)
        family = parts(wp)[1] is not None
        for name in [n for n in host if member_of(n, wp)]:
            i = index_of(wp, name) if family else None
            named: dict[str, str] = {c.role: _fill(lq.name(pat, c), i) for c in lq.companions}
            # each companion as the checkpoint stores it, in full (``runtime.binder.checks.Stored``)
            shown: dict[str, str] = {r: stored(src, n).name for r, n in named.items()}
            _Linear(layer, host, plan, lq, named, src, report, shown).check()


def _fill(pattern: str, i: int | None) -> str:
    return pattern if i is None else fill(pattern, i)


def _idx(flat: int, shape: tuple[int, ...]) -> Index:
    return tuple(int(k) for k in np.unravel_index(flat, shape)) if shape else ()


def _hex(a: Array, k: Index) -> str:
    """The stored bits of ``a[k]``, in hex."""
    raw = np.ascontiguousarray(a[k]).view(f"u{a.dtype.itemsize}").reshape(-1)
    return f"0x{int(raw[0]):0{2 * a.dtype.itemsize}X}"


def _dtype_name(a: Array) -> str:
    return next((d.name for d in DTYPES.values() if d.numpy == a.dtype), str(a.dtype))


def _whole(src: TensorSource, name: str, p: TensorPlan | None) -> Array | None:
    """The whole stored tensor ``name`` as an array of its planned dtype, or None."""
    if p is None or not isinstance(src, WholeSource):
        return None
    t = src.whole(name)
    if t is None or t.dtype != p.dtype or tuple(t.shape) != p.full_shape:
        return None
    np_dtype = DTYPES[t.dtype].numpy
    assert np_dtype is not None
    return np.frombuffer(t.data, dtype=np_dtype).reshape(p.full_shape)


class _Linear:
    """One linear member's stored companions, all viewed whole (when its block scale is a
    rank's share of at most ``WHOLE_CHECK_BYTES`` and the source can say) or all as this
    rank's share; ``where`` maps an index of the view to the whole tensor's coordinates."""

    def __init__(
        self, layer: int, host: Mapping[str, Array], plan: BlockPlan, lq: LayerQuant,
        named: dict[str, str], src: TensorSource, report: BindReport, shown: dict[str, str],
    ) -> None:  # fmt: skip
        self.layer, self.lq, self.named, self.report, self.plan = layer, lq, named, report, plan
        self.shown = shown  # each companion's stored name (compressed-tensors' weight_packed)
        self.arrays = {r: host[n] for r, n in named.items() if n in host}
        self.whole = False
        p = plan.tensors.get(named["block_scale"])
        if p is None or p.full_shape == p.local_shape or p.full_bytes > WHOLE_CHECK_BYTES:
            return
        views = {r: _whole(src, named[r], plan.tensors.get(named[r])) for r in self.arrays}
        if all(v is not None for v in views.values()):
            self.arrays = {r: v for r, v in views.items() if v is not None}
            self.whole = True
            report.verdict_bytes += p.full_bytes - p.local_bytes

    def where(self, role: str, local: Index) -> list[int]:
        """``local`` (an index of this view) in the whole tensor's coordinates."""
        out = list(local)
        p = self.plan.tensors.get(self.named[role])
        if self.whole or p is None:
            return out
        if p.members is not None:
            out[0] += p.members[0]
        if p.kind != "replicated" and p.local_shape != p.full_shape:
            out[p.axis] += p.offset
        return out

    def fail(self, text: str) -> None:
        raise BindError(
            f"{at(self.layer)}: {text} — refused: a dequantized field is finite unless its "
            "stored values are"
        )

    def check(self) -> None:
        if "shape" in self.arrays:
            self._shape()
        for role in ("global_scale", "input_scale"):
            if role in self.arrays:
                self._floats(role)
        op = self.lq.scheme.dequant.op
        if op == "dequant_mxfp4":
            self._mxfp4()
        elif op == "dequant_nvfp4":
            self._nvfp4()
        elif op == "dequant_scaled":
            self._scaled()
        elif op == "dequant_int_group":
            self._int_group()
        else:
            self._fp8_block()

    def _shape(self) -> None:
        """A stored shape companion (compressed-tensors' ``weight_shape``) is the linear's own
        ``[O, I]``: its packed weight's ``[O, I / pf]`` words times the packing."""
        words = self.plan.tensors[self.named["weight"]].full_shape
        per = self.lq.scheme.per_byte
        want = [int(words[-2]), int(words[-1]) * per]
        got = [int(x) for x in self.arrays["shape"].reshape(-1)]
        if got != want:
            self.fail(
                f"{self.shown['shape']} is {got}, but {self.shown['weight']} is {words[-2]} x "
                f"{words[-1]} words of {per} codes: the linear is {want}; the checkpoint "
                "contradicts itself"
            )

    def _floats(self, role: str) -> Array:
        """A float scale's F32 values; its first NaN or Inf is refused by index and bits."""
        a = self.arrays[role]
        f = e4m3_to_f32(a) if a.dtype == E4M3 else a.astype(F32)
        bad = ~np.isfinite(f)
        if bool(bad.any()):
            k = _idx(int(np.argmax(bad)), f.shape)
            self.fail(
                f"{self.shown[role]} element {self.where(role, k)} is {float(f[k])!r} "
                f"({_hex(a, k)}), a non-finite {_dtype_name(a)} scale"
            )
        return f

    def _mxfp4(self) -> None:
        s = self.arrays["block_scale"]  # U8 E8M0 [..., O, G]
        nan = s == 255
        if bool(nan.any()):
            k = _idx(int(np.argmax(nan)), s.shape)
            self.fail(
                f"{self.shown['block_scale']} element {self.where('block_scale', k)} is 0xFF, "
                "the E8M0 NaN: every value of its 32-element block would be NaN"
            )
        hot = np.flatnonzero(s >= MX_SUSPECT)
        if hot.size:
            eff = np.ldexp(np.float32(1), s.reshape(-1)[hot].astype(np.int32) - 127)
            self._codes(hot, eff.astype(F32), lambda g: f"2^{int(s[g]) - 127}")

    def _nvfp4(self) -> None:
        s = self._floats("block_scale")  # F32 [..., O, I/g]
        g = self._floats("global_scale").reshape(self.arrays["global_scale"].shape)
        lead, rows = s.shape[:-2], s.shape[-2]
        per = row_scales(g, lead, rows, self.named["global_scale"]).reshape(*lead, rows, 1)
        divide = self.lq.scheme.dequant.global_op == "divide"
        with np.errstate(all="ignore"):
            eff = s / per if divide else s * per  # the formula's F32 group scale
        bad = ~np.isfinite(eff)
        if bool(bad.any()):
            k = _idx(int(np.argmax(bad)), eff.shape)
            self.fail(
                f"{self.shown['block_scale']} element {self.where('block_scale', k)} "
                f"({float(s[k])!r}) {'/' if divide else '*'} {self.shown['global_scale']} "
                f"({float(per[(*k[:-1], 0)])!r}) is {float(eff[k])!r}: every value of its "
                "group would be non-finite"
            )
        flat = eff.reshape(-1)
        hot = np.flatnonzero(np.abs(flat) > SAFE / E2M1_MAX)
        if hot.size:
            self._codes(hot, flat[hot], lambda k: f"{float(s[k])!r}, group scale {float(eff[k])!r}")

    def _codes(self, hot: Array, eff: Array, shown: Callable[[Index], str]) -> None:
        """Refuse the first E2M1 code (group order, low nibble first: column order) whose
        value times its F32 group scale (``eff``, one per suspect group) is no finite BF16;
        ``hot``: the flat indices of the suspect groups in the block scale."""
        w, s = self.arrays["weight"], self.arrays["block_scale"]
        groups = w.reshape(s.size, -1)  # a group's bytes are contiguous: [groups, bytes]
        read = groups[hot]  # [n, bytes]: only the suspect groups' codes are touched
        if self.whole:
            self.report.verdict_bytes += read.nbytes
        mags = NIBBLES[read].reshape(len(hot), -1)  # [n, bytes, 2] -> [n, 2·bytes]
        with np.errstate(all="ignore"):
            vals = (mags * eff[:, None]).astype(BF16).astype(F32)  # the formula's roundings
        over = ~np.isfinite(vals)
        if not bool(over.any()):
            return
        n, j = _idx(int(np.argmax(over)), over.shape)
        g = _idx(int(hot[n]), s.shape)
        wk = _idx(int(hot[n]) * groups.shape[1] + j // 2, w.shape)
        b = int(w[wk])
        code = (b >> 4) & 15 if j % 2 else b & 15
        self.fail(
            f"{self.shown['weight']} element {self.where('weight', wk)} "
            f"{'high' if j % 2 else 'low'} nibble 0x{code:X} (E2M1 {'-' if code & 8 else ''}"
            f"{E2M1_MAGNITUDES[code & 7]}) times {self.shown['block_scale']} element "
            f"{self.where('block_scale', g)} = {_hex(s, g)} ({shown(g)}) overflows BF16"
        )

    def _int_group(self) -> None:
        """Integer codes in groups: a code difference is at most ``2^bits - 1``, so only rows
        with a scale past BF16's largest over that can overflow; those rows are dequantized
        by the formula and the first non-finite value refused."""
        bits = self.lq.scheme.dequant.bits
        limit = np.float32(SAFE / (1 << bits))
        a = self.arrays["block_scale"]  # [O, groups]
        if a.dtype == BF16:  # on the bits, with no F32 copy: |s| > limit <=> its magnitude
            mag = a.view(np.uint16) & 0x7FFF  # bits exceed those of limit cut to BF16
            cut = int(np.array(limit, F32).view(np.uint32)) >> 16
            if int(mag.max(initial=0)) <= cut:  # one pass: no NaN, no Inf, no suspect row
                return
            if bool((mag >= 0x7F80).any()):  # a NaN or Inf: refused, by index, below
                self._floats("block_scale")
            rows = np.flatnonzero((mag > cut).any(axis=-1))
        else:
            rows = np.flatnonzero((np.abs(self._floats("block_scale")) > limit).any(axis=-1))
        if not rows.size:
            return
        s = self.arrays["block_scale"]
        w, z = self.arrays["weight"], self.arrays.get("zero_point")
        pf = 32 // bits
        for block in sorted({int(r) // pf for r in rows}):  # the rows one zero word row spans
            r0, r1 = block * pf, min(block * pf + pf, w.shape[0])
            zb = None if z is None else z[block : block + 1]
            if self.whole:
                self.report.verdict_bytes += w[r0:r1].nbytes
            vals = dequant_int_group(w[r0:r1], s[r0:r1], zb, bits=bits).astype(np.float32)
            bad = ~np.isfinite(vals)
            if bool(bad.any()):
                r, c = _idx(int(np.argmax(bad)), bad.shape)
                g = c // (vals.shape[1] // s.shape[1])
                self.fail(
                    f"{self.shown['weight']} row {self.where('weight', (r0 + r, 0))[0]} column "
                    f"{c}: its code times {self.shown['block_scale']} element "
                    f"{self.where('block_scale', (r0 + r, g))} ({float(s[r0 + r, g])!r}) "
                    "overflows BF16"
                )

    def _scaled(self) -> None:
        """FP8 or int8 codes times one scale per row or per linear: only the rows whose scale
        times the largest code could overflow BF16 are read; the first code that does is
        refused."""
        s = self._floats("block_scale").reshape(-1)  # [O] or [1]
        w = self.arrays["weight"]  # F8_E4M3 or I8 [O, I]
        rows = w.reshape(-1, w.shape[-1])
        e4m3 = w.dtype == E4M3
        limit = SAFE / (E4M3_MAX if e4m3 else 128.0)
        for r in np.flatnonzero(np.abs(s) > limit):
            hit = range(rows.shape[0]) if s.size == 1 else [int(r)]
            for row in hit:
                self._scaled_row(rows[row], row, float(s[r]), e4m3, w.shape)

    def _scaled_row(
        self, codes: Array, row: int, scale: float, e4m3: bool, shape: tuple[int, ...]
    ) -> None:
        vals = e4m3_to_f32(codes) if e4m3 else codes.astype(np.float32)
        if self.whole:
            self.report.verdict_bytes += codes.nbytes
        one = np.array([[scale]], dtype=F32)  # the row's own scale, as a one-row matrix's
        out = dequant_scaled(codes.reshape(1, -1), one).astype(np.float32).reshape(-1)
        over = ~np.isfinite(out) & np.isfinite(vals)  # a stored NaN code stays allowed
        if bool(over.any()):
            wi = _idx(row * codes.size + int(np.argmax(over)), shape)
            self.fail(
                f"{self.shown['weight']} element {self.where('weight', wi)} = "
                f"{float(vals[wi[-1]])!r} times {self.shown['block_scale']} ({scale!r}) "
                "overflows BF16"
            )

    def _fp8_block(self) -> None:
        s = self._floats("block_scale")  # F32 [..., O/bo, I/bi]
        hot = np.flatnonzero(np.abs(s).reshape(-1) > SAFE / E4M3_MAX)
        if not hot.size:
            return
        bo, bi = self.lq.scheme.dequant.group[:2]
        w = self.arrays["weight"]  # F8_E4M3 [..., O, I]
        lead = w.shape[:-2]
        w3 = w.reshape(-1, *w.shape[-2:])
        s3 = s.reshape(-1, *s.shape[-2:])
        first: tuple[Index, Index] | None = None  # (weight index, scale index), row-major
        for h in hot:
            m, rb, cb = _idx(int(h), s3.shape)
            tile = e4m3_to_f32(w3[m, rb * bo : (rb + 1) * bo, cb * bi : (cb + 1) * bi])
            if self.whole:
                self.report.verdict_bytes += tile.size
            with np.errstate(all="ignore"):
                vals = (tile * s3[m, rb, cb]).astype(BF16).astype(F32)
            over = ~np.isfinite(vals) & np.isfinite(tile)  # a stored NaN code stays allowed
            if bool(over.any()):
                r, c = _idx(int(np.argmax(over)), over.shape)
                top = _idx(m, lead)
                at_w = (*top, rb * bo + r, cb * bi + c)
                if first is None or at_w < first[0]:
                    first = (at_w, (*top, rb, cb))
        if first is not None:
            wi, si = first
            self.fail(
                f"{self.shown['weight']} element {self.where('weight', wi)} = {_hex(w, wi)} "
                f"({float(e4m3_to_f32(w[wi]))!r}) times {self.shown['block_scale']} element "
                f"{self.where('block_scale', si)} ({float(s[si])!r}) overflows BF16"
            )
