"""specbind binds a real checkpoint written by transformers' GLM-5.3-Flash model (glm5_next).

The checkpoint is not synthesised by specbind: a tiny ``Glm5NextTextModel`` writes it with
``save_pretrained``, so the names, the split q/k/v convolutions and the F32 gates are exactly what
transformers' conversion mapping puts on disk. The key claims: every field specbind binds verbatim
equals, bit for bit, what transformers itself loads back from the same file with
``from_pretrained``; every field it computes (DSA's q_absorb, o_absorb, scaled weights_proj and
F32 ape) is within one BF16 ulp of an f64 reference made from transformers' own module weights,
at every tensor-parallel size and rank, and the rank shards rejoin into the TP=1 bytes.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import patience
import pytest
from helpers import INDEXER_FIELDS
from safetensors import safe_open
from whole_model import F32_IN_MODULE

from specbind.core.dtypes import bf16_ulp
from specbind.core.errors import BindError
from specbind.generated import MODELS, SPECS_SHA256
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

# exc_type=ImportError: a present but broken install (not only a missing one) skips too.
torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)
if not hasattr(transformers, "Glm5NextTextModel"):
    pytest.skip("this transformers has no glm5_next model", allow_module_level=True)

pytestmark = pytest.mark.interop

REPO = Path(__file__).resolve().parents[2]
MODEL = "glm-5.3-flash"

# The tiny geometry: linear_num_heads * linear_head_dim = 512 keeps KDA's scan_tile constraint,
# (2 * (H / tp) * D) % 256 == 0, at tp = 1, 2 and 4; num_attention_heads = 4 splits DSA's heads
# at the same sizes. index_topk_pattern makes layer 7 a "shared" DSA layer (no indexer).
CONFIG: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=32,
    kv_lora_rank=16,
    qk_nope_head_dim=16,
    v_head_dim=24,  # not qk_nope_head_dim: a swapped N and V cannot hide
    qk_rope_head_dim=0,
    index_n_heads=8,  # 8 ** -0.5 is not a power of two: the scaled weights_proj rounds
    index_head_dim=16,
    index_kpool=4,
    index_topk=8,
    linear_num_heads=8,
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
# DSA geometry (NoPE: qk_rope_head_dim = 0, so q_b_proj holds only the nope rows of each head).
X = CONFIG["hidden_size"]
NH = CONFIG["num_attention_heads"]  # 4: TP = 1, 2 and 4 all divide it
NOPE = CONFIG["qk_nope_head_dim"]
V = CONFIG["v_head_dim"]
KVL = CONFIG["kv_lora_rank"]
QL = CONFIG["q_lora_rank"]
IH = CONFIG["index_n_heads"]
TP_RANKS = [(tp, rank) for tp in (1, 2, 4) for rank in range(tp)]

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
# Only DSA's verbatim fields map to one parameter; the computed ones are checked against the f64
# reference below (q_b_proj, kv_b_proj and o_proj are bound only through the two absorbs).
DSA_PARAMS = {
    "q_a_proj": "q_a_proj.weight",
    "q_a_layernorm": "q_a_layernorm.weight",
    "kv_a_proj": "kv_a_proj_with_mqa.weight",
    "kv_a_layernorm": "kv_a_layernorm.weight",
    "wq_b": "indexer.wq_b.weight",
    "wk": "indexer.wk.weight",
    "k_norm_weight": "indexer.k_norm.weight",
    "k_norm_bias": "indexer.k_norm.bias",
    "compress_gate": "indexer.index_kpool_compress_gate",
}
DSA_COMPUTED = frozenset({"q_absorb", "o_absorb", "weights_proj", "ape"})


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
            if gates_f32 and F32_IN_MODULE.fullmatch(name):
                p.data = values  # the real checkpoint keeps A_log, dt_bias, mHC base/scale F32
                kept += 1
            else:
                p.data = values.to(torch.bfloat16)
    # A_log and dt_bias per KDA layer, mHC base and scale twice per layer
    assert kept == (2 * len(KDA_LAYERS) + 4 * CONFIG["num_hidden_layers"] if gates_f32 else 0)
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


def f64(t: Any) -> np.ndarray:
    """A torch parameter as float64 numpy: exact for BF16 and F32 alike."""
    return t.detach().double().numpy()


def ulps(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest |got - ref| in BF16 ulps of ref; got is specbind's BF16 field, widened exactly."""
    assert got.dtype == ml_dtypes.bfloat16, got.dtype
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert np.isfinite(ref).all()
    return float(np.max(np.abs(got.astype(np.float64) - ref) / bf16_ulp(ref)))


@dataclass(frozen=True)
class Reference:
    """A DSA layer's computed fields at TP=1, in float64, from transformers' loaded module."""

    q_absorb: np.ndarray  # [NH * KVL, QL]
    o_absorb: np.ndarray  # [X, NH * KVL]
    weights_proj: np.ndarray | None  # [IH, X]; None on a shared layer (no indexer)

    def q_rows(self, tp: int, rank: int) -> np.ndarray:
        """Rank ``rank`` holds heads [rank * NH/tp, (rank + 1) * NH/tp): their KVL rows each."""
        n = NH // tp * KVL
        return self.q_absorb[rank * n : (rank + 1) * n]

    def o_cols(self, tp: int, rank: int) -> np.ndarray:
        n = NH // tp * KVL
        return self.o_absorb[:, rank * n : (rank + 1) * n]


def reference(module: Any) -> Reference:
    """The absorbs from the definitions, in float64, over transformers' own parameters.

    q_absorb[h*KVL + c, k] = sum_r kv_b[h*(NOPE+V) + r, c] * q_b[h*NOPE + r, k]
    o_absorb[i, h*KVL + c] = sum_r o_proj[i, h*V + r] * kv_b[h*(NOPE+V) + NOPE + r, c]
    """
    kv_b = f64(module.kv_b_proj.weight).reshape(NH, NOPE + V, KVL)
    q_b = f64(module.q_b_proj.weight).reshape(NH, NOPE, QL)
    o = f64(module.o_proj.weight).reshape(X, NH, V)
    q_absorb = np.einsum("hrc,hrk->hck", kv_b[:, :NOPE], q_b).reshape(NH * KVL, QL)
    o_absorb = np.einsum("ihr,hrc->ihc", o, kv_b[:, NOPE:]).reshape(X, NH * KVL)
    wp = None
    if module.indexer is not None:
        wp = f64(module.indexer.weights_proj.weight) * IH**-0.5
    return Reference(q_absorb, o_absorb, wp)


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
    return bind_checkpoint(CheckpointDir(ckpt), MODELS[MODEL], progress=False)


@pytest.fixture(scope="module")
def bind_at(ckpt: Path, bound: BindResult) -> Callable[[int, int], BindResult]:
    """Bind ``ckpt`` at (tp, rank), once per pair; (1, 0) is the ``bound`` fixture itself."""
    cache: dict[tuple[int, int], BindResult] = {(1, 0): bound}

    def get(tp: int, rank: int) -> BindResult:
        if (tp, rank) not in cache:
            cache[tp, rank] = bind_checkpoint(
                CheckpointDir(ckpt), MODELS[MODEL], tp_size=tp, tp_rank=rank, progress=False
            )
        return cache[tp, rank]

    return get


@pytest.fixture(scope="module")
def hf(ckpt: Path) -> Loaded:
    model, info = transformers.Glm5NextTextModel.from_pretrained(ckpt, output_loading_info=True)
    return Loaded(model, info)


@pytest.fixture(scope="module")
def refs(hf: Loaded) -> dict[int, Reference]:
    return {i: reference(attn(hf, i)) for i in DSA_LAYERS}


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


def test_transformers_checkpoint_binds_every_layer_with_no_unknowns(
    bound: BindResult, on_disk: dict[str, tuple[str, Any]]
) -> None:
    kinds = {i: "kda" for i in KDA_LAYERS} | {i: "dsa" for i in DSA_LAYERS}
    assert [(layer.index, layer.slots["attention"].block) for layer in bound.layers] == sorted(
        kinds.items()
    )
    for layer in bound.layers:
        r = layer.slots["attention"].report
        assert (r.index, r.kind) == (layer.index, layer.slots["attention"].block)
        assert r.bound == r.seen > 0 and r.other == 0
        # bytes counts what was read from the file: at TP=1, every self_attn tensor of the layer.
        p = f"layers.{layer.index}.self_attn."
        read = [t for n, (_, t) in on_disk.items() if n.startswith(p)]
        assert r.bound == len(read)
        assert r.bytes == sum(t.numel() * t.element_size() for t in read), layer.index
        if (
            layer.slots["attention"].block == "kda"
        ):  # KDA binds verbatim (conv is a concat): the same bytes come out
            assert r.bytes == sum(
                a.nbytes for a in layer.slots["attention"].weights.arrays().values()
            )


def test_shared_dsa_layer_binds_without_indexer_fields(bound: BindResult) -> None:
    shared = bound.layers[SHARED_DSA].slots["attention"].weights
    full = bound.layers[FULL_DSA].slots["attention"].weights
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
        conv = bound.layers[i].slots["attention"].weights.conv
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
        conv = bound.layers[i].slots["attention"].weights.conv
        for part, name in enumerate(("q_conv1d", "k_conv1d", "v_conv1d")):
            _, t = on_disk[f"layers.{i}.self_attn.{name}.weight"]
            rows = conv[part * Q : (part + 1) * Q]
            assert same_bits(rows, t.squeeze(1)), (i, name)


def test_bound_gates_stay_f32_and_equal_transformers_forget_gate_byte_for_byte(
    bound: BindResult, hf: Loaded
) -> None:
    for i in KDA_LAYERS:
        w = bound.layers[i].slots["attention"].weights
        gate = attn(hf, i).forget_gate
        for mine, theirs in ((w.a_log, gate.A_log), (w.dt_bias, gate.dt_bias)):
            assert mine.dtype == np.float32
            assert theirs.dtype == torch.float32
            assert same_bits(mine, theirs), i


def test_every_verbatim_bound_field_equals_the_transformers_parameter(
    bound: BindResult, hf: Loaded
) -> None:
    """q_proj and every other verbatim field: BF16 bits equal when transformers loads BF16, else
    widened. Every bound field is compared: conv and DSA's computed fields by their own tests."""
    for layer in bound.layers:
        params = KDA_PARAMS if layer.slots["attention"].block == "kda" else DSA_PARAMS
        own_test = {"conv"} if layer.slots["attention"].block == "kda" else DSA_COMPUTED
        fields = layer.slots["attention"].weights.arrays()
        if layer.index == SHARED_DSA:
            want = (set(params) | own_test) - set(INDEXER_FIELDS)
        else:
            want = set(params) | own_test
        assert set(fields) == want, layer.index
        module = attn(hf, layer.index)
        for field, arr in fields.items():
            if field in own_test:
                continue
            theirs = module.get_parameter(params[field])
            assert same_bits(arr, theirs), (layer.index, field)


def test_f64_reference_is_what_transformers_own_attention_path_computes(
    hf: Loaded, refs: dict[int, Reference]
) -> None:
    """The reference's head layout is transformers', not only the definitions' reading of it.

    In float64, on random latents: q_b_proj then expand_kv's K half gives the same q.k scores as
    the absorbed query against the latent; expand_kv's V half then o_proj (the forward's head
    concat) gives the same output as the per-head latent mix through o_absorb.
    """
    gen = torch.Generator().manual_seed(1)
    s = 5
    for i in DSA_LAYERS:
        module = copy.deepcopy(attn(hf, i)).double()
        ref = refs[i]
        with torch.no_grad():
            x = torch.randn(1, s, QL, dtype=torch.float64, generator=gen)  # q_resid
            c = torch.randn(1, 1, s, KVL, dtype=torch.float64, generator=gen)  # latent k_pass
            k, v = module.expand_kv(c, c[..., :0])  # NoPE: k_rot is empty
            q = module.q_b_proj(x).view(1, s, -1, module.qk_head_dim).transpose(1, 2)
            scores = (q @ k.transpose(2, 3))[0].numpy()  # [NH, s, s]
            p = torch.softmax(torch.randn(1, NH, s, s, dtype=torch.float64, generator=gen), -1)
            out = module.o_proj((p @ v).transpose(1, 2).reshape(1, s, -1))[0].numpy()  # [s, X]
        x_, c_, p_ = x[0].numpy(), c[0, 0].numpy(), p[0].numpy()
        qa = (x_ @ ref.q_absorb.T).reshape(s, NH, KVL)
        np.testing.assert_allclose(np.einsum("shc,tc->hst", qa, c_), scores, rtol=1e-10, atol=0)
        mixed = np.einsum("hst,tc->shc", p_, c_).reshape(s, NH * KVL)
        np.testing.assert_allclose(mixed @ ref.o_absorb.T, out, rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize(("tp", "rank"), TP_RANKS)
def test_absorbed_weights_match_an_f64_reference_from_transformers_modules_within_one_bf16_ulp(
    bind_at: Callable[[int, int], BindResult], refs: dict[int, Reference], tp: int, rank: int
) -> None:
    """Full and shared DSA layers alike: this rank's heads of q_absorb (rows) and o_absorb
    (columns), rounded once to BF16, are at most 1 BF16 ulp from the f64 reference."""
    result = bind_at(tp, rank)
    assert (result.tp_size, result.tp_rank) == (tp, rank)
    for i in DSA_LAYERS:
        w = result.layers[i].slots["attention"].weights
        assert (w.q_absorb.dtype, w.o_absorb.dtype) == (ml_dtypes.bfloat16,) * 2
        assert w.q_absorb.shape == (NH // tp * KVL, QL)
        assert w.o_absorb.shape == (X, NH // tp * KVL)
        assert ulps(w.q_absorb, refs[i].q_rows(tp, rank)) <= 1.0, (i, "q_absorb")
        assert ulps(w.o_absorb, refs[i].o_cols(tp, rank)) <= 1.0, (i, "o_absorb")


@pytest.mark.parametrize(("tp", "rank"), TP_RANKS)
def test_indexer_weights_proj_is_scaled_within_one_bf16_ulp_and_ape_widens_exactly(
    bind_at: Callable[[int, int], BindResult],
    hf: Loaded,
    refs: dict[int, Reference],
    tp: int,
    rank: int,
) -> None:
    """Replicated: every rank holds the whole scaled weights_proj and the whole F32 ape."""
    w = bind_at(tp, rank).layers[FULL_DSA].slots["attention"].weights
    indexer = attn(hf, FULL_DSA).indexer
    assert w.weights_proj is not None and w.ape is not None
    assert w.weights_proj.shape == (IH, X)
    assert ulps(w.weights_proj, refs[FULL_DSA].weights_proj) <= 1.0
    # ape: BF16 in the file, F32 bound; the widening is exact, so the F32 bits are equal.
    theirs = indexer.index_kpool_compress_ape.detach().float().numpy()
    assert w.ape.dtype == np.float32
    assert w.ape.shape == theirs.shape == (CONFIG["index_kpool"], CONFIG["index_head_dim"])
    assert np.array_equal(w.ape.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shared_dsa_layer_binds_without_indexer_fields_at_every_tp(
    bind_at: Callable[[int, int], BindResult], tp: int
) -> None:
    """transformers' index_topk_pattern "...S" makes layer 7 shared: no indexer on any rank."""
    for rank in range(tp):
        layers = bind_at(tp, rank).layers
        shared, full = (
            layers[SHARED_DSA].slots["attention"].weights,
            layers[FULL_DSA].slots["attention"].weights,
        )
        assert all(getattr(shared, f) is None for f in INDEXER_FIELDS), (tp, rank)
        assert all(getattr(full, f) is not None for f in INDEXER_FIELDS), (tp, rank)
        assert set(full.arrays()) - set(shared.arrays()) == set(INDEXER_FIELDS)
        assert not set(shared.arrays()) & set(INDEXER_FIELDS)


@pytest.mark.parametrize("tp", [2, 4])
def test_rank_shards_rejoin_into_the_tp1_fields_byte_for_byte(
    bind_at: Callable[[int, int], BindResult], tp: int
) -> None:
    """The output does not depend on tp: q_absorb's rank blocks stacked (rows) and o_absorb's
    laid side by side (columns) are the TP=1 bytes; every other field is TP=1's on every rank."""
    whole = bind_at(1, 0).layers
    ranks = [bind_at(tp, r).layers for r in range(tp)]
    for i in DSA_LAYERS:
        one = whole[i].slots["attention"].weights.arrays()
        parts = [layers[i].slots["attention"].weights.arrays() for layers in ranks]
        for field, axis in (("q_absorb", 0), ("o_absorb", 1)):
            joined = np.concatenate([p[field] for p in parts], axis=axis)
            assert joined.dtype == one[field].dtype
            assert joined.shape == one[field].shape
            assert joined.tobytes() == one[field].tobytes(), (tp, i, field)
        for field, arr in one.items():
            if field in ("q_absorb", "o_absorb"):
                continue
            for r, p in enumerate(parts):
                assert set(p) == set(one)
                assert p[field].dtype == arr.dtype
                assert p[field].tobytes() == arr.tobytes(), (tp, r, i, field)


def test_cli_bind_out_writes_the_transformers_conv(
    ckpt: Path, bound: BindResult, hf: Loaded, tmp_path: Path
) -> None:
    out_file = tmp_path / "bound.safetensors"
    proc = patience.run(
        [sys.executable, "-m", "specbind", "bind", str(ckpt), "--json", "--out", str(out_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        cpu=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["tp_size"], doc["tp_rank"]) == (1, 0)
    assert [x["slots"]["attention"] for x in doc["layers"]] == [
        layer.slots["attention"].report.as_dict() for layer in bound.layers
    ]
    want = set(bound.fields())
    with safe_open(out_file, "pt") as f:
        assert set(f.keys()) == want
        meta = f.metadata()
        assert (meta["model"], meta["specs_sha256"]) == (MODEL, SPECS_SHA256)
        for i in KDA_LAYERS:
            conv = f.get_tensor(f"layers.{i}.attention.conv")
            assert (conv.dtype, tuple(conv.shape)) == (torch.bfloat16, (3 * Q, K))
            theirs = attn(hf, i).conv1d.weight.squeeze(1)
            assert np.array_equal(f32_bits(conv), f32_bits(theirs)), i
            assert f.get_tensor(f"layers.{i}.attention.a_log").dtype == torch.float32


def test_wholesale_bf16_cast_of_gates_is_refused(wholesale_bf16_ckpt: Path) -> None:
    on_disk = read_file(wholesale_bf16_ckpt)
    assert on_disk[f"layers.{KDA_LAYERS[0]}.self_attn.A_log"][0] == "BF16"
    assert on_disk[f"layers.{KDA_LAYERS[0]}.self_attn.dt_bias"][0] == "BF16"
    with pytest.raises(BindError) as e:
        bind_checkpoint(CheckpointDir(wholesale_bf16_ckpt), MODELS[MODEL], progress=False)
    msg = str(e.value)
    assert "A_log" in msg or "dt_bias" in msg
    assert "BF16" in msg
    assert "would change" in msg
