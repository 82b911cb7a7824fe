"""specbind binds a real checkpoint written by transformers' GLM-5.3-Flash model (glm5_next).

The checkpoint is not synthesised by specbind: a tiny ``Glm5NextTextModel`` writes it with
``save_pretrained``, so the names, the split q/k/v convolutions and the F32 gates are exactly what
transformers' conversion mapping puts on disk. The key claim is that what specbind binds equals,
bit for bit, what transformers itself loads back from the same file with ``from_pretrained``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

from generated import MODELS, SPECS_SHA256
from runtime.bind import BindResult, bind_checkpoint
from runtime.checkpoint import Checkpoint
from runtime.errors import BindError

# exc_type=ImportError: a present but broken install (not only a missing one) skips too.
torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)
if not hasattr(transformers, "Glm5NextTextModel"):
    pytest.skip("this transformers has no glm5_next model", allow_module_level=True)

pytestmark = pytest.mark.interop

REPO = Path(__file__).resolve().parent.parent
MODEL = "glm-5.3-flash"

# The tiny geometry: linear_num_heads * linear_head_dim = 256 keeps KDA's scan_tile constraint,
# (2 * H * D) % 256 == 0. index_topk_pattern makes layer 7 a "shared" DSA layer (no indexer).
CONFIG: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=32,
    kv_lora_rank=16,
    qk_nope_head_dim=16,
    v_head_dim=16,
    qk_rope_head_dim=0,
    index_n_heads=4,
    index_head_dim=16,
    index_kpool=4,
    index_topk=8,
    linear_num_heads=4,
    linear_head_dim=64,
    linear_conv_kernel_dim=4,
    intermediate_size=64,
    moe_intermediate_size=32,
    n_routed_experts=4,
    num_experts_per_tok=2,
    vocab_size=128,
    index_topk_pattern="FFFFFFFS",
    pad_token_id=0,
)
H = CONFIG["linear_num_heads"]
Q = H * CONFIG["linear_head_dim"]  # q/k/v channels of one KDA layer
K = CONFIG["linear_conv_kernel_dim"]
KDA_LAYERS = (0, 1, 2, 4, 5, 6)
DSA_LAYERS = (3, 7)
FULL_DSA, SHARED_DSA = DSA_LAYERS
INDEXER_FIELDS = (
    "wq_b",
    "wk",
    "k_norm_weight",
    "k_norm_bias",
    "weights_proj",
    "compress_gate",
    "ape",
)

# The KDA forget gate as transformers' module tree names it; its conversion mapping writes these
# two as the flat checkpoint names self_attn.A_log / self_attn.dt_bias.
GATE_PARAM = re.compile(r"layers\.\d+\.self_attn\.forget_gate\.(A_log|dt_bias)")

# Each bound field -> the parameter of transformers' loaded attention module holding the same
# values (conv is checked on its own: transformers fuses it into one conv1d.weight).
KDA_PARAMS = {
    "q_proj": "q_proj.weight",
    "k_proj": "k_proj.weight",
    "v_proj": "v_proj.weight",
    "f_a": "forget_gate.f_a_proj.weight",
    "f_b": "forget_gate.f_b_proj.weight",
    "dt_bias": "forget_gate.dt_bias",
    "a_log": "forget_gate.A_log",
    "b_proj": "b_proj.weight",
    "g_a": "g_a_proj.weight",
    "g_b": "g_b_proj.weight",
    "o_norm": "o_norm.weight",
    "o_proj": "o_proj.weight",
}
DSA_PARAMS = {
    "q_a_proj": "q_a_proj.weight",
    "q_a_layernorm": "q_a_layernorm.weight",
    "q_b_proj": "q_b_proj.weight",
    "kv_a_proj": "kv_a_proj_with_mqa.weight",
    "kv_a_layernorm": "kv_a_layernorm.weight",
    "kv_b_proj": "kv_b_proj.weight",
    "o_proj": "o_proj.weight",
    "wq_b": "indexer.wq_b.weight",
    "wk": "indexer.wk.weight",
    "k_norm_weight": "indexer.k_norm.weight",
    "k_norm_bias": "indexer.k_norm.bias",
    "weights_proj": "indexer.weights_proj.weight",
    "compress_gate": "indexer.index_kpool_compress_gate",
    "ape": "indexer.index_kpool_compress_ape",
}


def write_checkpoint(path: Path, *, gates_f32: bool) -> Path:
    """Save a tiny Glm5NextTextModel with random (not init) values, BF16 but for the gates.

    gates_f32=False casts the whole model to BF16, A_log and dt_bias included: a broken file.
    """
    torch.manual_seed(0)
    model = transformers.Glm5NextTextModel(transformers.Glm5NextTextConfig(**CONFIG))
    kept = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            # randn, so norms are not all ones and no two tensors share their values.
            values = torch.randn(p.shape, dtype=torch.float32) * 0.02
            if gates_f32 and GATE_PARAM.fullmatch(name):
                p.data = values  # the real checkpoint keeps A_log and dt_bias in F32
                kept += 1
            else:
                p.data = values.to(torch.bfloat16)
    assert kept == (2 * len(KDA_LAYERS) if gates_f32 else 0)
    model.save_pretrained(path)
    return path


def read_file(ckpt: Path) -> dict[str, tuple[str, Any]]:
    """Every tensor of every .safetensors file in ``ckpt``: name -> (dtype as written, tensor)."""
    out: dict[str, tuple[str, Any]] = {}
    for shard in sorted(ckpt.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            for name in f.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                assert name not in out, f"{name} is in two shards"
                out[name] = (f.get_slice(name).get_dtype(), f.get_tensor(name))
    return out


def f32_bits(x: Any) -> np.ndarray:
    """The F32 bit patterns of a BF16 or F32 array/tensor, BF16 widened first.

    Widening BF16 -> F32 is exact (the 16 BF16 bits become the high half, the low half is zero),
    so equal F32 bits mean equal source values, byte for byte.
    """
    if isinstance(x, torch.Tensor):
        x = x.detach().float().numpy()
    assert x.dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)), x.dtype
    return np.ascontiguousarray(x.astype(np.float32)).view(np.uint32)


def same_bits(bound: np.ndarray, theirs: Any) -> bool:
    """``bound`` (specbind) and ``theirs`` (torch) hold the same values, bit for bit."""
    if bound.shape != tuple(theirs.shape):
        return False
    if bound.dtype == ml_dtypes.bfloat16 and theirs.dtype == torch.bfloat16:
        # Both BF16: compare the 16-bit patterns directly.
        mine = np.ascontiguousarray(bound).view(np.uint16)
        other = theirs.detach().contiguous().view(torch.int16).numpy().view(np.uint16)
        return bool(np.array_equal(mine, other))
    return bool(np.array_equal(f32_bits(bound), f32_bits(theirs)))


@dataclass(frozen=True)
class Loaded:
    model: Any
    info: dict[str, Any]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("glm5_next"), gates_f32=True)


@pytest.fixture(scope="module")
def wholesale_bf16_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("glm5_next_bf16"), gates_f32=False)


@pytest.fixture(scope="module")
def on_disk(ckpt: Path) -> dict[str, tuple[str, Any]]:
    return read_file(ckpt)


@pytest.fixture(scope="module")
def bound(ckpt: Path) -> BindResult:
    return bind_checkpoint(Checkpoint(ckpt), MODELS[MODEL], progress=False)


@pytest.fixture(scope="module")
def hf(ckpt: Path) -> Loaded:
    model, info = transformers.Glm5NextTextModel.from_pretrained(ckpt, output_loading_info=True)
    return Loaded(model, info)


def attn(loaded: Loaded, i: int) -> Any:
    return loaded.model.layers[i].self_attn


def test_transformers_writes_split_conv_and_flat_gate_names(
    on_disk: dict[str, tuple[str, Any]],
) -> None:
    """The file holds the names specbind's KDA spec declares, not transformers' module names."""
    for i in KDA_LAYERS:
        p = f"layers.{i}.self_attn."
        for conv in ("q_conv1d", "k_conv1d", "v_conv1d"):
            dtype, t = on_disk[f"{p}{conv}.weight"]
            assert (dtype, tuple(t.shape)) == ("BF16", (Q, 1, K))
        assert (on_disk[f"{p}A_log"][0], tuple(on_disk[f"{p}A_log"][1].shape)) == ("F32", (H,))
        assert (on_disk[f"{p}dt_bias"][0], tuple(on_disk[f"{p}dt_bias"][1].shape)) == ("F32", (Q,))
        assert f"{p}f_a_proj.weight" in on_disk
        assert f"{p}f_b_proj.weight" in on_disk
        # transformers' in-memory names (fused conv, forget_gate submodule) never reach the file.
        assert f"{p}conv1d.weight" not in on_disk
        assert not [n for n in on_disk if n.startswith(f"{p}forget_gate.")]
    assert f"layers.{FULL_DSA}.self_attn.indexer.wk.weight" in on_disk
    assert not [n for n in on_disk if n.startswith(f"layers.{SHARED_DSA}.self_attn.indexer.")]
    # Random values: no two attention tensors are byte-identical, so a swap cannot pass unseen.
    attn_bytes = [
        t.contiguous().view(torch.uint8).numpy().tobytes()
        for n, (_, t) in on_disk.items()
        if ".self_attn." in n
    ]
    assert len(set(attn_bytes)) == len(attn_bytes)


def test_transformers_checkpoint_binds_every_layer_with_no_unknowns(bound: BindResult) -> None:
    kinds = {i: "kda" for i in KDA_LAYERS} | {i: "dsa" for i in DSA_LAYERS}
    assert [(layer.index, layer.kind) for layer in bound.layers] == sorted(kinds.items())
    for layer in bound.layers:
        r = layer.report
        assert (r.index, r.kind) == (layer.index, layer.kind)
        assert r.bound == r.self_attn_seen > 0
        assert r.unknown_self_attn == []
        assert r.bytes == sum(a.nbytes for a in layer.weights.arrays().values())


def test_shared_dsa_layer_binds_without_indexer_fields(bound: BindResult) -> None:
    shared = bound.layers[SHARED_DSA].weights
    full = bound.layers[FULL_DSA].weights
    assert shared.wk is None
    assert all(getattr(shared, f) is None for f in INDEXER_FIELDS)
    assert all(getattr(full, f) is not None for f in INDEXER_FIELDS)
    assert set(full.arrays()) - set(shared.arrays()) == set(INDEXER_FIELDS)


def test_transformers_loads_its_own_checkpoint_with_no_missing_keys(hf: Loaded) -> None:
    # Otherwise from_pretrained would leave fresh init values and the comparisons below would
    # compare specbind against noise.
    assert not hf.info["missing_keys"]
    assert not hf.info["unexpected_keys"]
    assert not hf.info["mismatched_keys"]


def test_bound_conv_equals_transformers_fused_conv1d_byte_for_byte(
    bound: BindResult, hf: Loaded
) -> None:
    for i in KDA_LAYERS:
        conv = bound.layers[i].weights.conv
        assert conv.dtype == ml_dtypes.bfloat16
        assert conv.shape == (3 * Q, K)
        # transformers keeps conv1d in F32 (_keep_in_fp32_modules_strict) after concatenating the
        # three [Q, 1, K] tensors into one [3Q, 1, K]. Widening specbind's BF16 to F32 is exact,
        # so equal uint32 views mean byte-for-byte equal values, nothing within a tolerance.
        theirs = attn(hf, i).conv1d.weight.detach().squeeze(1).float().numpy()
        assert theirs.shape == conv.shape
        assert np.array_equal(conv.astype(np.float32).view(np.uint32), theirs.view(np.uint32)), i


def test_bound_conv_rows_are_q_then_k_then_v_conv1d_from_the_file(
    bound: BindResult, on_disk: dict[str, tuple[str, Any]]
) -> None:
    for i in KDA_LAYERS:
        conv = bound.layers[i].weights.conv
        for part, name in enumerate(("q_conv1d", "k_conv1d", "v_conv1d")):
            _, t = on_disk[f"layers.{i}.self_attn.{name}.weight"]
            rows = conv[part * Q : (part + 1) * Q]
            assert same_bits(rows, t.squeeze(1)), (i, name)


def test_bound_gates_stay_f32_and_equal_transformers_forget_gate_byte_for_byte(
    bound: BindResult, hf: Loaded
) -> None:
    for i in KDA_LAYERS:
        w = bound.layers[i].weights
        gate = attn(hf, i).forget_gate
        for mine, theirs in ((w.a_log, gate.A_log), (w.dt_bias, gate.dt_bias)):
            assert mine.dtype == np.float32
            assert theirs.dtype == torch.float32
            assert same_bits(mine, theirs), i


def test_every_bound_field_equals_the_transformers_parameter(bound: BindResult, hf: Loaded) -> None:
    """q_proj and every other field: BF16 bits equal when transformers loads BF16, else widened."""
    for layer in bound.layers:
        params = KDA_PARAMS if layer.kind == "kda" else DSA_PARAMS
        fields = layer.weights.arrays()
        # Every bound field is compared: conv by its own test, the rest here; none is skipped.
        assert set(fields) - {"conv"} <= set(params)
        if layer.kind == "kda":
            assert set(fields) == set(params) | {"conv"}
        module = attn(hf, layer.index)
        for field, arr in fields.items():
            if field == "conv":
                continue
            theirs = module.get_parameter(params[field])
            assert same_bits(arr, theirs), (layer.index, field)


def test_cli_bind_out_writes_the_transformers_conv(
    ckpt: Path, bound: BindResult, hf: Loaded, tmp_path: Path
) -> None:
    out_file = tmp_path / "bound.safetensors"
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", "bind", str(ckpt), "--json", "--out", str(out_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) == {"tp_size", "tp_rank", "layers", "seconds"}
    assert (doc["tp_size"], doc["tp_rank"]) == (1, 0)
    assert doc["layers"] == [layer.report.as_dict() for layer in bound.layers]

    want = {
        f"layers.{layer.index}.{field}"
        for layer in bound.layers
        for field in layer.weights.arrays()
    }
    with safe_open(out_file, "pt") as f:
        assert set(f.keys()) == want
        meta = f.metadata()
        assert (meta["model"], meta["specs_sha256"]) == (MODEL, SPECS_SHA256)
        for i in KDA_LAYERS:
            conv = f.get_tensor(f"layers.{i}.conv")
            assert (conv.dtype, tuple(conv.shape)) == (torch.bfloat16, (3 * Q, K))
            theirs = attn(hf, i).conv1d.weight.squeeze(1)
            assert np.array_equal(f32_bits(conv), f32_bits(theirs)), i
            assert f.get_tensor(f"layers.{i}.a_log").dtype == torch.float32


def test_wholesale_bf16_cast_of_gates_is_refused(wholesale_bf16_ckpt: Path) -> None:
    on_disk = read_file(wholesale_bf16_ckpt)
    assert on_disk[f"layers.{KDA_LAYERS[0]}.self_attn.A_log"][0] == "BF16"
    assert on_disk[f"layers.{KDA_LAYERS[0]}.self_attn.dt_bias"][0] == "BF16"
    with pytest.raises(BindError) as e:
        bind_checkpoint(Checkpoint(wholesale_bf16_ckpt), MODELS[MODEL], progress=False)
    msg = str(e.value)
    assert "A_log" in msg or "dt_bias" in msg
    assert "BF16" in msg
    assert "would change" in msg
