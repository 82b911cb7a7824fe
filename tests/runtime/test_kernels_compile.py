"""Every generated kernel compiles for sm_90 and sm_100 (Hopper and Blackwell): with NVRTC
(the compiler CuPy uses; the nvidia-cuda-nvrtc wheel runs without a GPU) and with the
machine's nvcc when it has one, for each arch that compiler knows. A compile error fails the
test run."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import patience
import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "generated" / "kernels" / "specbind.cu"
KERNELS = [line.split("void ")[1].split("(")[0] for line in SOURCE.read_text().splitlines()
           if line.startswith('extern "C" __global__ void ')]  # fmt: skip


def nvrtc() -> ctypes.CDLL:
    import nvidia

    for root in nvidia.__path__:
        for lib in sorted(Path(root).glob("cu*/lib/libnvrtc.so*")) + sorted(
            Path(root).glob("cuda_nvrtc/lib/libnvrtc.so*")
        ):
            if "builtins" not in lib.name:
                return ctypes.CDLL(str(lib))
    raise FileNotFoundError("libnvrtc from the nvidia-cuda-nvrtc wheel")


def compile_nvrtc(source: str, arch: str, names: list[str] | None = None) -> tuple[int, str, int]:
    """(result code, log, cubin bytes) of NVRTC compiling ``source`` for ``arch``; every name
    in ``names`` must come out as a kernel entry point."""
    lib = nvrtc()
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"specbind.cu", 0, None, None)
    assert rc == 0, f"nvrtcCreateProgram: {rc}"
    for n in names or []:
        assert lib.nvrtcAddNameExpression(prog, n.encode()) == 0
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    cubin = ctypes.c_size_t(0)
    if rc == 0:
        assert lib.nvrtcGetCUBINSize(prog, ctypes.byref(cubin)) == 0
        for n in names or []:
            lowered = ctypes.c_char_p()
            assert lib.nvrtcGetLoweredName(prog, n.encode(), ctypes.byref(lowered)) == 0, n
            assert lowered.value == n.encode(), (n, lowered.value)  # extern "C": not mangled
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, log.value.decode(errors="replace"), cubin.value


def test_the_generated_source_declares_the_kernels_the_wrappers_launch() -> None:
    wrappers = (REPO / "generated" / "kernels" / "__init__.py").read_text()
    assert KERNELS, "no kernels found"
    for k in KERNELS:
        assert f"def {k}(" in wrappers, k


ARCHS = ["sm_90", "sm_100"]


def nvrtc_archs() -> set[str]:
    lib = nvrtc()
    n = ctypes.c_int()
    assert lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)) == 0
    archs = (ctypes.c_int * n.value)()
    assert lib.nvrtcGetSupportedArchs(archs) == 0
    return {f"sm_{a}" for a in archs}


@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_compiles_with_nvrtc(arch: str) -> None:
    try:
        known = nvrtc_archs()
    except (ImportError, FileNotFoundError, OSError) as e:
        pytest.fail(f"NVRTC is part of the test extra and must load here: {e}")
    if arch not in known:
        pytest.skip(f"this NVRTC does not know {arch}")
    rc, log, cubin = compile_nvrtc(SOURCE.read_text(), arch, KERNELS)
    assert rc == 0, log
    assert cubin > 0


def test_a_broken_kernel_fails_the_nvrtc_compile() -> None:
    rc, log, _ = compile_nvrtc(
        SOURCE.read_text() + '\nextern "C" __global__ void broken() { undeclared = 1; }\n', "sm_90"
    )
    assert rc != 0 and "undeclared" in log


def nvcc_archs() -> set[str]:
    listed = patience.run(
        ["nvcc", "--list-gpu-arch"], capture_output=True, text=True, check=True, cpu=60
    ).stdout.split()
    return {a.replace("compute_", "sm_") for a in listed}


@pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="no nvcc on this machine (NVRTC still checked)"
)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_compiles_with_nvcc(tmp_path: Path, arch: str) -> None:
    if arch not in nvcc_archs():
        pytest.skip(f"this nvcc does not know {arch}")
    out = tmp_path / "specbind.cubin"
    proc = patience.run(
        ["nvcc", f"-arch={arch}", "-cubin", "-o", str(out), str(SOURCE)],
        capture_output=True,
        text=True,
        cpu=300,
    )
    assert proc.returncode == 0, proc.stderr
    symbols = subprocess.run(
        ["readelf", "-sW", str(out)], capture_output=True, text=True, check=True
    ).stdout
    for k in KERNELS:  # the cubin is an ELF; every kernel is a function symbol in it
        assert f" {k}\n" in symbols or symbols.rstrip().endswith(f" {k}"), k
