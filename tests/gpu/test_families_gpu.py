"""The new model families on a real GPU: every field the CuPy backend binds for a synthetic
Kimi Linear and DeepSeek-V3.2 checkpoint (the rope slices, the absorbs through cuBLAS) equals
the NumPy backend's, the absorbs within one BF16 ulp, at every tp rank."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from specbind.core.dtypes import within_one_bf16_ulp
from specbind.generated import MODELS
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.binder import backends
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.synth import synth, tiny_values


@pytest.mark.parametrize("name", ["kimi-linear", "deepseek-v3.2"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_cupy_backend_binds_the_new_families_as_numpy_does(
    tmp_path: Path, name: str, tp: int
) -> None:
    table = MODELS[name]
    synth(table, tmp_path / "ck", tiny_values(table), seed=4)
    ck = CheckpointDir(tmp_path / "ck")
    backend = backends.get("cupy", importlib.import_module("specbind.generated.kernels"))
    for rank in range(tp):
        host = bind_checkpoint(ck, table, tp_size=tp, tp_rank=rank, progress=False).fields()
        dev = bind_checkpoint(
            ck, table, tp_size=tp, tp_rank=rank, progress=False, backend=backend
        ).fields()
        assert dev.keys() == host.keys()
        for key, (rule, want) in host.items():
            got = backend.to_host(dev[key][1], rule.dtype)
            assert got.dtype == want.dtype and got.shape == want.shape, key
            if key.endswith("absorb"):
                assert within_one_bf16_ulp(got, want), key
            else:
                assert got.tobytes() == want.tobytes(), key
