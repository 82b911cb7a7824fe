"""``make gpu-check`` step 1: every generated kernel on the GPU against the CPU harness, bit
for bit, at several sizes including odd ones.

The CPU harness is the generated CUDA source compiled as host C++
(tests/support/kernels_cpu.py, tests/kernel_harness/), driven through a second copy of the
generated launch wrappers whose ``cupy()`` is the stand-in CuPy of tests/support/fake_cupy.py:
the same wrapper, the same arguments, the same grid, on the host. So the GPU and the harness
run one source with one argument list.

Invariants: the kernels are read from ``generated/kernels/specbind.cu`` (every
``extern "C" __global__`` in it), so a kernel with no inputs below is a failure, never a skip;
every comparison is of bytes. Trap: CUDA arithmetic returns its canonical NaN where host C++
keeps the operand's payload and sign, so for the kernels that multiply (``ARITH``) two NaNs
count as equal and are tallied apart (``nan_payload_differences``); everything else must
match in every bit. The harness needs a C++ compiler (g++ or c++) on the machine.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shutil
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from specbind.core.errors import SpecbindError

REPO = Path(__file__).resolve().parents[1]
KERNELS = REPO / "generated" / "kernels"
ARITH = (
    "scale_bf16",
    "dequant_nvfp4_bf16",
    "dequant_fp8_block_bf16",
    "dequant_int8_block_bf16",
    "dequant_int_group_bf16",
)
Case = tuple[str, tuple[Any, ...]]  # (what, wrapper arguments: arrays, lists of arrays, scalars)


def kernel_names() -> list[str]:
    """Every kernel the generated CUDA source defines, in source order."""
    src = (KERNELS / "specbind.cu").read_text()
    return re.findall(r'extern "C" __global__ void (\w+)\(', src)


def host_kernels(build_dir: Path) -> types.ModuleType:
    """The generated launch wrappers again, running on the CPU harness."""
    tests = REPO / "tests" / "support"
    if not (tests / "fake_cupy.py").exists():
        raise SpecbindError(f"the CPU harness is in a checkout's tests/support/; {tests} has none")
    if shutil.which("g++") is None and shutil.which("c++") is None:
        raise SpecbindError("the CPU harness needs a C++ compiler: neither g++ nor c++ is on PATH")
    build_dir.mkdir(parents=True, exist_ok=True)
    if str(tests) not in sys.path:
        sys.path.append(str(tests))
    fake = importlib.import_module("fake_cupy").make(str(build_dir))
    spec = importlib.util.spec_from_file_location("specbind_host_kernels", KERNELS / "__init__.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.cupy = lambda: fake  # type: ignore[attr-defined]
    return mod


def _bits(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> Any:
    info = np.iinfo(dtype)
    return rng.integers(0, int(info.max) + 1, size=shape, dtype=dtype)


def cases(name: str, scale: int) -> list[Case]:
    """Inputs for kernel ``name`` at several sizes (odd ones among them); ``scale`` multiplies
    the largest. Empty for a kernel this table does not know."""
    rng = np.random.default_rng(sum(map(ord, name)))
    big = 1 + (1 << 16) * scale
    sizes = (1, 7, 257, big)
    if name == "widen_bf16_f32":
        return [("every bit pattern", (np.arange(1 << 16, dtype=np.uint16),))] + [
            (f"n={n}", (_bits(rng, (n,), np.uint16),)) for n in sizes
        ]
    if name == "narrow_f32_bf16":
        ties = (np.arange(1 << 16, dtype=np.uint32) << 16) | np.uint32(0x8000)
        tie: list[Case] = [("every tie", (ties.view(np.float32),))]
        return tie + [(f"n={n}", (_bits(rng, (n,), np.uint32).view(np.float32),)) for n in sizes]
    if name == "scale_bf16":
        return [(f"n={n} x {f}", (_bits(rng, (n,), np.uint16), f)) for n in sizes
                for f in (0.125, -3.7, 3e38)]  # fmt: skip
    if m := re.fullmatch(r"gather_cols_b(\d)", name):
        dt = np.dtype(f"u{m[1]}")
        shapes = [(1, 1, 0, 1), (3, 7, 2, 3), (129, 67, 5, 61), (1 + 64 * scale, 1031, 17, 513)]
        return [(f"[{r}, {c}] cols {c0}+{w}", (_bits(rng, (r, c), dt), c0, w))
                for r, c, c0, w in shapes]  # fmt: skip
    if m := re.fullmatch(r"concat_rows_(\d+)_b(\d)", name):
        k, dt = int(m[1]), np.dtype(f"u{m[2]}")
        out: list[Case] = []
        for width, base in ((1, 1), (3, 5), (7, 97), (5, 129 * scale)):
            counts = [base + 2 * i for i in range(k)]
            out.append((f"{counts} x {width}", ([_bits(rng, (r, width), dt) for r in counts],)))
        return out
    if name == "dequant_nvfp4_bf16":
        return list(_nvfp4(rng, scale))
    if name == "dequant_int8_block_bf16":  # per channel (1, I) and per tensor (O, I) blocks
        i8: list[Case] = []
        int8_shapes = (((), 1, 1, True), ((), 7, 9, False), ((3,), 129, 131, True),
                   ((), 257, 64 * scale + 3, True))  # fmt: skip
        for lead, rows, cols, per_row in int8_shapes:
            w = _bits(rng, (*lead, rows, cols), np.uint8).view(np.int8)
            sc = rng.uniform(-4, 4, (*lead, rows if per_row else 1, 1)).astype(np.float32)
            block = (1 if per_row else rows, cols)
            i8.append((f"{[*lead, rows, cols]} block {block}", (w, sc, *block)))
        return i8
    if name == "dequant_int_group_bf16":  # 4- and 8-bit codes, with and without a zero point
        ig: list[Case] = []
        int_shapes = (((), 1, 1, 1, 4, False), ((), 9, 3, 3, 4, True),
                      ((2,), 130, 16, 4, 8, True), ((), 257, 16 * scale, 2, 4, False))  # fmt: skip
        for lead, rows, words, groups, bits, zero in int_shapes:
            pf = 32 // bits
            p = _bits(rng, (*lead, rows, words), np.uint32).view(np.int32)
            sc = rng.uniform(-4, 4, (*lead, rows, groups)).astype(np.float32)
            z = _bits(rng, (*lead, -(-rows // pf), groups), np.uint32).view(np.int32)
            what = f"{[*lead, rows, words * pf]} {bits}-bit groups {groups} zero {zero}"
            ig.append((what, (p, sc, z if zero else None, bits)))
        return ig
    if name == "dequant_fp8_block_bf16":
        fp8: list[Case] = []
        for lead, rows, cols, block in (((), 1, 1, (128, 128)), ((), 7, 9, (3, 5)),
                                        ((3,), 129, 131, (64, 128)),
                                        ((), 257, 64 * scale + 3, (128, 128))):  # fmt: skip
            w = _bits(rng, (*lead, rows, cols), np.uint8)
            s = rng.uniform(-4, 4, (*lead, -(-rows // block[0]), -(-cols // block[1])))
            fp8.append((f"{[*lead, rows, cols]} block {block}", (w, s.astype(np.float32), *block)))
        return fp8
    if m := re.fullmatch(r"swizzle_blockscale_b(\d)", name):
        dt = np.dtype(f"u{m[1]}")
        layouts: list[tuple[int, ...]] = [(1, 1), (7, 3), (2, 129, 5), (3, 257, 67 * scale)]
        return [(f"{list(s)}", (_bits(rng, s, dt),)) for s in layouts]
    return []


def _nvfp4(rng: np.random.Generator, scale: int) -> Iterator[Case]:
    for lead, rows, groups, group, segments in (((), 1, 1, 16, 1), ((), 7, 3, 32, 7),
                                                ((2,), 129, 5, 16, 3),
                                                ((), 63 * scale, 9, 16, 1)):  # fmt: skip
        cols = groups * group
        packed = _bits(rng, (*lead, rows, cols // 2), np.uint8)
        sc = _bits(rng, (*lead, rows, groups), np.uint8)
        gs = rng.uniform(-2, 2, int(np.prod(lead, dtype=np.int64)) * segments).astype(np.float32)
        for divide, neg in ((False, False), (True, True)):
            what = f"{[*lead, rows, cols]} group {group} segments {segments} divide {divide}"
            yield what, (packed, sc, gs, group, divide, neg)


def _convert(args: tuple[Any, ...], up: Callable[[Any], Any]) -> tuple[Any, ...]:
    return tuple(
        up(a) if isinstance(a, np.ndarray) else [up(p) for p in a] if isinstance(a, list) else a
        for a in args
    )


def compare(name: str, got: Any, want: Any) -> dict[str, Any]:
    """Bytes of the kernel's output on the GPU (``got``) against the harness's (``want``)."""
    row: dict[str, Any] = {"shape": list(want.shape), "dtype": str(want.dtype)}
    if got.shape != want.shape or got.dtype != want.dtype:
        return row | {"equal": False, "why": f"GPU gave {list(got.shape)} {got.dtype}"}
    bits = np.dtype(f"u{want.dtype.itemsize}")  # compare bits: NaN != NaN as floats
    g = np.ascontiguousarray(got).reshape(-1).view(bits)
    w = np.ascontiguousarray(want).reshape(-1).view(bits)
    differ = g != w
    nan_pairs = 0
    if name in ARITH and g.dtype == np.uint16:  # BF16 bits: two NaNs of any payload agree
        both = ((g & 0x7FFF) > 0x7F80) & ((w & 0x7FFF) > 0x7F80)
        nan_pairs = int(np.count_nonzero(differ & both))
        differ &= ~both
    bad = np.flatnonzero(differ)
    row |= {"equal": bad.size == 0, "mismatches": int(bad.size),
            "nan_payload_differences": nan_pairs}  # fmt: skip
    if bad.size:
        i = int(bad[0])
        row |= {"first_index": i, "got": int(g[i]), "want": int(w[i])}
    return row


def run(device: Any, host: Any, cp: Any, scale: int = 16) -> dict[str, Any]:
    """Every kernel's cases on ``device`` (the generated wrappers on CuPy) against ``host``
    (the same wrappers on the harness): one row per case, ``ok`` when all are equal."""
    rows: list[dict[str, Any]] = []
    for name in kernel_names():
        todo = cases(name, scale)
        if not todo:
            why = "no inputs for this kernel in benchmarks/gpu_kernels.py"
            rows.append({"kernel": name, "case": None, "equal": False, "why": why})
            continue
        for what, args in todo:
            want = getattr(host, name)(*_convert(args, host.cupy().asarray))
            got = getattr(device, name)(*_convert(args, cp.asarray)).get()
            rows.append({"kernel": name, "case": what} | compare(name, got, np.asarray(want)))
    return {
        "ok": all(r["equal"] for r in rows),
        "kernels": len({r["kernel"] for r in rows}),
        "cases": len(rows),
        "rows": rows,
    }
