"""The CuPy backend without a GPU: clear refusals when CuPy or a device is missing, and the
whole device path (uploads, generated kernels, launch checks, matmuls) run against a stand-in
CuPy whose kernels execute on the CPU harness — with bytes equal to the NumPy backend's."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import patience
import pytest
from helpers import TABLE, TINY

from specbind.core.dtypes import within_one_bf16_ulp
from specbind.core.errors import SpecbindError
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.binder import backends
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.synth import synth


def test_without_cupy_the_cupy_backend_is_refused_in_one_line(tmp_path: Path) -> None:
    synth(TABLE, tmp_path / "ck", dict(TINY), layers=4, mtp=False)
    proc = patience.run([sys.executable, "-m", "specbind", "bind", str(tmp_path / "ck"), "--backend", "cupy"],
                        capture_output=True, text=True, cpu=60)  # fmt: skip
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    assert proc.returncode == 1
    assert (
        proc.stderr
        == "specbind: error: --backend cupy needs CuPy (pip install 'specbind[gpu]'): No module named 'cupy'\n"
    )


def test_with_cupy_but_no_device_the_backend_is_refused_naming_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class CUDARuntimeError(RuntimeError):
        pass

    def no_driver() -> int:
        raise CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=no_driver))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with pytest.raises(
        SpecbindError,
        match=r"--backend cupy needs a CUDA device: CUDARuntimeError: cudaErrorNoDevice",
    ):
        backends.get("cupy", importlib.import_module("specbind.generated.kernels"))


@pytest.mark.parametrize("tp", [1, 2])
def test_the_device_path_gives_the_numpy_backends_bytes(
    fake_cupy: Any, tmp_path: Path, tp: int
) -> None:
    synth(TABLE, tmp_path / "ck", dict(TINY), layers=8, seed=5)
    ck = CheckpointDir(tmp_path / "ck")
    host = bind_checkpoint(ck, TABLE, tp_size=tp, progress=False)
    backend = backends.get("cupy", importlib.import_module("specbind.generated.kernels"))
    dev = bind_checkpoint(ck, TABLE, tp_size=tp, progress=False, backend=backend)
    on_device = dev.fields()
    assert on_device.keys() == host.fields().keys()
    for name, (rule, want) in host.fields().items():
        got_dev = on_device[name][1]
        assert isinstance(got_dev, fake_cupy.ndarray), f"{name} stayed on the host"
        got = backend.to_host(got_dev, rule.dtype)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        if rule.kind == "transform" and name.endswith("absorb"):
            assert within_one_bf16_ulp(got, want), name
        else:
            assert got.tobytes() == want.tobytes(), name


def test_the_device_path_writes_the_host_paths_out_file_when_its_matmul_is_numpys(
    fake_cupy: Any, tmp_path: Path
) -> None:
    """Byte-identical here because the stand-in's matmul is NumPy's; on a GPU cuBLAS may sum in
    another order, and tests/gpu allows the absorbed fields 1 BF16 ulp."""
    from specbind.cli import main

    synth(TABLE, tmp_path / "ck", dict(TINY), layers=4, seed=2, mtp=False)
    assert main(["bind", str(tmp_path / "ck"), "--out", str(tmp_path / "host.safetensors")]) == 0
    assert (
        main(
            [
                "bind",
                str(tmp_path / "ck"),
                "--backend",
                "cupy",
                "--out",
                str(tmp_path / "dev.safetensors"),
            ]
        )
        == 0
    )
    assert (tmp_path / "host.safetensors").read_bytes() == (
        tmp_path / "dev.safetensors"
    ).read_bytes()


def test_a_launch_with_a_wrong_argument_is_refused_before_it_runs(fake_cupy: Any) -> None:
    import specbind.generated.kernels as k

    with pytest.raises(
        k.KernelError, match=r"widen_bf16_f32: in is float32, the kernel reads uint16"
    ):
        k.widen_bf16_f32(fake_cupy.asarray(np.zeros(4, np.float32)))
    with pytest.raises(k.KernelError, match=r"narrow_f32_bf16: in is not C-contiguous"):
        k.narrow_f32_bf16(fake_cupy.asarray(np.zeros((4, 4), np.float32))[:, ::2])
    with pytest.raises(k.KernelError, match=r"in is ndarray, not a CuPy array"):
        k.narrow_f32_bf16(np.zeros(4, np.float32))
    with pytest.raises(k.KernelError, match=r"columns \[3, 9\) do not fit 8"):
        k.gather_cols_b2(fake_cupy.asarray(np.zeros((2, 8), np.uint16)), 3, 6)


def test_an_empty_tensor_launches_nothing_and_comes_back_empty(fake_cupy: Any) -> None:
    import specbind.generated.kernels as k

    out = k.widen_bf16_f32(fake_cupy.asarray(np.zeros((0, 3), np.uint16)))
    assert out.shape == (0, 3) and str(out.dtype) == "float32"
    assert k.narrow_f32_bf16(fake_cupy.asarray(np.zeros(0, np.float32))).size == 0
