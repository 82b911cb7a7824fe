"""Which CUDA kernels the specs need, and each kernel's signature.

One table drives three emitted files: the CUDA source, the CuPy launch wrappers and the host
launch shims the CPU test harness links against, so their argument lists cannot drift apart.
Kernels are the load-time work CuPy lacks or that gains from fusion: BF16 widen and
round-to-nearest-even narrow, a fused BF16 scale, strided column gathers (column shards and
slices) and row concatenation, and the quantized-checkpoint numerics (NVFP4 and FP8-block
dequant to BF16, the CUTLASS block-scale swizzle), which must equal
``runtime.binder.quant_numerics`` bit for bit. Contractions are not here: they go to cuBLAS via
cupy.matmul.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbind.core.dtypes import DTYPES
from specbind.generator.block_spec import Block

WIDTH_TYPES = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
DTYPE_BYTES = {name: d.bits // 8 for name, d in DTYPES.items() if d.bits % 8 == 0}


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str  # C type in the kernel signature

    @property
    def is_pointer(self) -> bool:
        return self.ctype.endswith("*")


@dataclass(frozen=True)
class Kernel:
    name: str
    kind: str  # widen | narrow | scale | gather | concat | nvfp4 | fp8_block | swizzle
    params: tuple[Param, ...]
    width: int = 0  # element bytes, for gather and concat
    parts: int = 0  # inputs, for concat
    doc: str = ""


def _p(*pairs: tuple[str, str]) -> tuple[Param, ...]:
    return tuple(Param(n, t) for n, t in pairs)


N = ("n", "long long")


def needed(blocks: list[Block]) -> list[Kernel]:
    """The kernels the given blocks use, in a stable order."""
    gathers: set[int] = set()
    concats: set[tuple[int, int]] = set()
    for b in blocks:
        for t in b.tensors:
            if t.shard.kind == "cols":
                gathers.add(DTYPE_BYTES[t.dtype])
        for o in b.outputs:
            if o.kind == "concat":
                concats.add((len(o.sources), DTYPE_BYTES[b.tensor(o.sources[0]).dtype]))
            if o.transform is not None:
                for op in o.transform.operands:
                    if op.slice is not None:
                        gathers.add(DTYPE_BYTES[b.tensor(op.tensor).dtype])
    bf16_in, bf16_out = ("in", "const bf16_bits*"), ("out", "bf16_bits*")
    out = [
        Kernel("widen_bf16_f32", "widen", _p(bf16_in, ("out", "float*"), N),
               doc="BF16 -> F32, exact: the 16 bits become the top half of the F32"),
        Kernel("narrow_f32_bf16", "narrow", _p(("in", "const float*"), bf16_out, N),
               doc="F32 -> BF16, round to nearest even; NaN stays NaN, overflow goes to Inf"),
        Kernel("scale_bf16", "scale", _p(bf16_in, bf16_out, ("factor", "float"), N),
               doc="BF16 -> F32, times factor in F32, -> BF16 (nearest even), in one pass"),
    ]  # fmt: skip
    ll = "long long"
    for w in sorted(gathers):
        e = WIDTH_TYPES[w]
        params = _p(("in", f"const {e}*"), ("out", f"{e}*"), ("rows", ll), ("in_cols", ll),
                    ("col0", ll), ("width", ll))  # fmt: skip
        doc = f"out[r, c] = in[r, col0 + c] for {w}-byte elements"
        out.append(Kernel(f"gather_cols_b{w}", "gather", params, width=w, doc=doc))
    for k, w in sorted(concats):
        e = WIDTH_TYPES[w]
        pairs: list[tuple[str, str]] = []
        for i in range(k):
            pairs += [(f"in{i}", f"const {e}*"), (f"n{i}", ll)]
        pairs.append(("out", f"{e}*"))
        doc = f"out = [in0; in1; ...] for {k} row-major inputs of {w}-byte elements"
        out.append(Kernel(f"concat_rows_{k}_b{w}", "concat", _p(*pairs), width=w, parts=k, doc=doc))
    out += quant_kernels()
    return out


def quant_kernels() -> list[Kernel]:
    """The quantized-checkpoint kernels; emitted always for now (a scheme in use may later
    decide). Geometry, group size and the multiply/divide choice are arguments."""
    ll, u8_in = "long long", "const unsigned char*"
    return [
        Kernel("dequant_nvfp4_bf16", "nvfp4",
               _p(("packed", u8_in), ("scale", u8_in), ("global_scale", "const float*"),
                  ("out", "bf16_bits*"), ("rows", ll), ("rows_per_scale", ll), ("cols", ll),
                  ("group", ll), ("divide", "int"), ("negative_zero", "int")),
               doc="NVFP4 -> BF16: E2M1[code] * (f32(E4M3 scale) * or / global), rounded once"),
        Kernel("dequant_fp8_block_bf16", "fp8_block",
               _p(("weight", u8_in), ("scale", "const float*"), ("out", "bf16_bits*"),
                  ("mats", ll), ("rows", ll), ("cols", ll), ("block_rows", ll),
                  ("block_cols", ll)),
               doc="FP8 E4M3 -> BF16: f32(weight[r, c]) * scale[r / block_rows, c / block_cols]"),
        Kernel("dequant_int8_block_bf16", "int8_block",
               _p(("weight", "const signed char*"), ("scale", "const float*"),
                  ("out", "bf16_bits*"), ("mats", ll), ("rows", ll), ("cols", ll),
                  ("block_rows", ll), ("block_cols", ll)),
               doc="int8 -> BF16: f32(weight[r, c]) * scale[r / block_rows, c / block_cols]"),
        Kernel("dequant_int_group_bf16", "int_group",
               _p(("packed", "const int*"), ("scale", "const float*"), ("zero", "const int*"),
                  ("out", "bf16_bits*"), ("mats", ll), ("rows", ll), ("cols", ll),
                  ("groups", ll), ("bits", "int"), ("has_zero", "int")),
               doc="int4/int8 codes in int32 words -> BF16: f32(code - zero) * scale per group"),
        Kernel("swizzle_blockscale_b1", "swizzle",
               _p(("in", u8_in), ("out", "unsigned char*"), ("mats", ll), ("rows", ll),
                  ("cols", ll), ("rows_pad", ll), ("cols_pad", ll)),
               doc="block scales -> the CUTLASS FP4 layout: 128x4 tiles, zero padding"),
    ]  # fmt: skip
