"""The public API: ``specbind.open(path)`` -> ``.audit()``, ``.plan()``, ``.bind()``, and the
torch backend's dtypes, bytes and memory sharing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import patience
import pytest
from helpers import TINY

import specbind
from specbind.core.errors import BindError, SpecbindError
from specbind.generated import MODELS
from specbind.generated.dsa import DsaWeights
from specbind.generated.kda import KdaWeights
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.synth import synth

REPO = Path(__file__).resolve().parents[2]
TABLE = MODELS["glm-5.3-flash"]
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("api") / "ck"
    synth(TABLE, out, dict(TINY), layers=8, seed=11)
    return out


def cli(*args: str) -> Any:
    proc = patience.run(
        [sys.executable, "-m", "specbind", *args, "--json"], capture_output=True, text=True,
        cpu=120, check=True,
    )  # fmt: skip
    return json.loads(proc.stdout)


def test_audit_and_plan_are_what_the_cli_prints(ckpt: Path) -> None:
    ck = specbind.open(ckpt)
    assert ck.model == "glm-5.3-flash" and ck.path == ckpt.resolve()
    assert ck.audit() == cli("audit", str(ckpt))
    assert ck.plan(tp_size=2, ep_size=2) == cli(
        "plan", str(ckpt), "--tp-size", "2", "--ep-size", "2"
    )


@pytest.mark.parametrize(("tp", "rank"), [(1, 0), (2, 1)])
def test_a_numpy_bind_holds_the_bytes_the_binder_gives(ckpt: Path, tp: int, rank: int) -> None:
    m = specbind.open(ckpt).bind(tp_size=tp, tp_rank=rank)
    want = bind_checkpoint(CheckpointDir(ckpt), TABLE, tp_size=tp, tp_rank=rank, progress=False)
    got = m.tensors()
    assert got.keys() == want.fields().keys()
    for name, (_, a) in want.fields().items():
        assert got[name].dtype == a.dtype and got[name].tobytes() == a.tobytes(), name
    assert (m.tp_size, m.tp_rank, m.backend) == (tp, rank, "numpy")
    assert m.globals is not None and set(m.globals.tensors) == {"embed_tokens", "norm", "lm_head"}


def test_torch_tensors_carry_the_fields_dtype_and_the_same_bits(ckpt: Path) -> None:
    host = specbind.open(ckpt).bind(tp_size=2, tp_rank=0)
    m = specbind.open(ckpt).bind(tp_size=2, tp_rank=0, backend="torch")
    names = {"BF16": torch.bfloat16, "F32": torch.float32}
    seen = set()
    for layer, hlayer in zip(m.layers, host.layers, strict=True):
        for slot_name, slot in layer.slots.items():
            for field, t in slot.tensors.items():
                dtype = slot.dtypes[field]
                a = hlayer.slots[slot_name].tensors[field]
                assert isinstance(t, torch.Tensor) and t.dtype == names[dtype], field
                assert tuple(t.shape) == a.shape, field
                bits = t.view(torch.uint16 if dtype == "BF16" else torch.int32).numpy()
                assert bits.tobytes() == a.tobytes(), field
                seen.add(dtype)
    assert seen == {"BF16", "F32"}


def test_a_writable_array_is_shared_with_torch_and_a_read_only_one_is_copied() -> None:
    """Absorbed fields are fresh writable arrays: torch wraps their memory. Verbatim fields are
    views of the checkpoint's read-only map, which torch must not share (a write would fault)."""
    import ml_dtypes

    from specbind.runtime.bind.to_torch import to_torch

    fresh = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)
    t = to_torch(fresh, "BF16")
    assert t.dtype == torch.bfloat16 and t.data_ptr() == fresh.ctypes.data
    mapped = np.frombuffer(fresh.tobytes(), dtype=ml_dtypes.bfloat16)  # read-only, like a map
    assert not mapped.flags.writeable
    c = to_torch(mapped, "BF16")
    assert (
        c.data_ptr() != mapped.ctypes.data
        and c.view(torch.uint16).tolist() == mapped.view(np.uint16).tolist()
    )
    c.fill_(1.0)  # torch owns writable memory


def test_a_write_to_a_bound_torch_tensor_never_reaches_the_checkpoint(ckpt: Path) -> None:
    shard = ckpt / "model-00001-of-00002.safetensors"
    before = shard.read_bytes()
    raw = bind_checkpoint(CheckpointDir(ckpt), TABLE, progress=False).layers[3].slots["attention"]
    assert not raw.weights.q_a_proj.flags.writeable, "verbatim fields map the file read-only"
    m = specbind.open(ckpt).bind(backend="torch")
    for t in m.tensors().values():
        t.zero_()
    assert shard.read_bytes() == before


def test_weights_as_gives_the_typed_dataclass_and_refuses_another_blocks(ckpt: Path) -> None:
    m = specbind.open(ckpt).bind(backend="torch")
    w = m.layers[3].slots["attention"].weights_as(DsaWeights)
    assert isinstance(w, DsaWeights) and w.q_absorb.dtype == torch.bfloat16
    with pytest.raises(
        BindError, match=r"slot 'attention' holds 'dsa' weights \(DsaWeights\), not KdaWeights"
    ):
        m.layers[3].slots["attention"].weights_as(KdaWeights)


def test_the_cupy_path_hands_device_arrays_to_torch_through_dlpack(
    ckpt: Path, fake_cupy: Any
) -> None:
    m = specbind.open(ckpt).bind(tp_size=2, tp_rank=1, backend="torch", device="cuda")
    host = specbind.open(ckpt).bind(tp_size=2, tp_rank=1)
    kda = m.layers[0].slots["attention"]
    assert kda.block == "kda"
    t = kda.tensors["q_proj"]
    assert t.dtype == torch.bfloat16
    assert (
        t.view(torch.uint16).numpy().tobytes()
        == host.layers[0].slots["attention"].tensors["q_proj"].tobytes()
    )


def test_bad_api_calls_are_refused_in_one_line(ckpt: Path) -> None:
    ck = specbind.open(ckpt)
    with pytest.raises(SpecbindError, match=r"unknown backend 'jax' \(numpy, cupy or torch\)"):
        ck.bind(backend="jax")  # type: ignore[call-overload]
    with pytest.raises(
        SpecbindError, match=r"backend 'numpy' lives on the host, not on device 'cuda:0'"
    ):
        ck.bind(device="cuda:0")
    with pytest.raises(
        SpecbindError,
        match=r"unknown model 'xlnet' \(generated: [^)]*glm-5\.3-flash[^)]*kimi-linear[^)]*\)",
    ):
        specbind.open(ckpt, model="xlnet")
    with pytest.raises(
        SpecbindError,
        match=r"kda: self_attn.q_proj.weight shards rows on linear_heads = 16 units, which tp 3 does not divide",
    ):
        ck.bind(tp_size=3, tp_rank=0)
    with pytest.raises(SpecbindError, match=r"device 'cuda:x': expected 'cpu', 'cuda' or 'cuda:N'"):
        ck.bind(device="cuda:x")
    with pytest.raises(SpecbindError, match=r"backend 'cupy' lives on a CUDA device, not on 'cpu'"):
        ck.bind(backend="cupy", device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(SpecbindError, match=r"device 'cuda:0': torch sees no CUDA device"):
            ck.bind(backend="torch", device="cuda:0")
    with pytest.raises(SpecbindError, match=r"/nowhere: no such directory"):
        specbind.open("/nowhere")


def test_the_example_runs(ckpt: Path) -> None:
    """It also type-checks under mypy --strict: ``make typecheck`` (a step of ``make test``)
    checks ``examples/`` with the package, so a second mypy process here would only repeat it."""
    example = REPO / "examples" / "bind_for_torch.py"
    run = patience.run(
        [sys.executable, str(example), str(ckpt), "2", "1"], capture_output=True, text=True,
        cpu=120, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "layer 3: q_absorb" in run.stdout and "torch.bfloat16" in run.stdout


def test_make_typecheck_covers_the_example() -> None:
    make = (REPO / "Makefile").read_text()
    line = next(x for x in make.splitlines() if "mypy --strict" in x)
    assert "examples" in line.split()


def test_a_quantized_checkpoint_binds_to_torch_as_uint8_codes_and_float8_scales(
    tmp_path: Path,
) -> None:
    """synth --quant stores every linear the scheme can hold; a shared DSA layer (no indexer)
    binds too: its absent indexer is neither quantized nor excluded."""
    out = tmp_path / "q"
    synth(
        TABLE,
        out,
        dict(TINY),
        layers=8,
        seed=4,
        quant=next(s for s in TABLE.schemes if s.name == "nvfp4-modelopt"),
    )
    ck = specbind.open(out)
    host = ck.bind(ep_size=2, ep_rank=1)
    m = ck.bind(ep_size=2, ep_rank=1, backend="torch")
    mlp = m.layers[7].slots["mlp"]
    assert mlp.dtypes["w2"] == "U8" and mlp.tensors["w2"].dtype == torch.uint8
    assert mlp.tensors["w2_weight_scale"].dtype == torch.float8_e4m3fn
    assert mlp.tensors["w2_weight_scale_2"].dtype == torch.float32
    for name, t in m.tensors().items():
        want = host.tensors()[name]
        assert t.reshape(-1).view(torch.uint8).numpy().tobytes() == want.tobytes(), (
            name
        )  # [-1]: 0-d


def test_open_picks_the_model_from_the_checkpoints_model_type(tmp_path: Path) -> None:
    from specbind.synth import tiny_values

    kimi = MODELS["kimi-linear"]
    synth(kimi, tmp_path / "kimi", tiny_values(kimi), layers=5, seed=1)
    ck = specbind.open(tmp_path / "kimi")
    assert ck.model == "kimi-linear"
    m = ck.bind(tp_size=2, tp_rank=1, backend="torch")
    assert m.model == "kimi-linear" and all(
        t.dtype in (torch.bfloat16, torch.float32) for t in m.tensors().values()
    )
    assert specbind.open(tmp_path / "kimi", model="kimi-linear").model == "kimi-linear"
