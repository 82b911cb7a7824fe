"""Every claim of the hand-written KDA binder, as a named test against the generated binder."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import REAL_KDA, TABLE, TINY_KDA, classify, layer_arrays, raw, source

from specbind.core import algebra
from specbind.core.errors import BindError, GeometryError
from specbind.core.planning import Ranks
from specbind.generated import kda
from specbind.runtime.io.source import DictSource

AUDITED = {
    "self_attn.q_proj.weight": ("BF16", (8192, 4096)),
    "self_attn.k_proj.weight": ("BF16", (8192, 4096)),
    "self_attn.v_proj.weight": ("BF16", (8192, 4096)),
    "self_attn.q_conv1d.weight": ("BF16", (8192, 1, 4)),
    "self_attn.k_conv1d.weight": ("BF16", (8192, 1, 4)),
    "self_attn.v_conv1d.weight": ("BF16", (8192, 1, 4)),
    "self_attn.f_a_proj.weight": ("BF16", (128, 4096)),
    "self_attn.f_b_proj.weight": ("BF16", (8192, 128)),
    "self_attn.g_a_proj.weight": ("BF16", (128, 4096)),
    "self_attn.g_b_proj.weight": ("BF16", (8192, 128)),
    "self_attn.b_proj.weight": ("BF16", (64, 4096)),
    "self_attn.A_log": ("F32", (64,)),
    "self_attn.dt_bias": ("F32", (8192,)),
    "self_attn.o_norm.weight": ("BF16", (128,)),
    "self_attn.o_proj.weight": ("BF16", (4096, 8192)),
}


def test_kda_spec_matches_the_audited_checkpoint_shapes() -> None:
    shapes = kda.expected_shapes(REAL_KDA)
    assert len(kda.TENSORS) == 15, "the KDA block has exactly 15 tensors"
    assert {r.name: (r.dtype, shapes[r.name]) for r in kda.TENSORS} == AUDITED


def test_model_geometry_binds_kda_with_the_real_values() -> None:
    from specbind.generated import model_glm_5_3_flash as m

    assert m.kda_geometry(m.geometry(TABLE.default_values()), Ranks()) == REAL_KDA


def test_dsa_and_mtp_blocks_do_not_classify_as_kda() -> None:
    dsa_names = [
        "self_attn.kv_a_proj_with_mqa.weight",
        "self_attn.kv_a_layernorm.weight",
        "self_attn.kv_b_proj.weight",
        "self_attn.q_a_proj.weight",
        "self_attn.q_b_proj.weight",
        "self_attn.indexer.wk.weight",
        "self_attn.indexer.wq_b.weight",
        "self_attn.o_proj.weight",
    ]
    block = classify(dsa_names)
    assert block is not None and block.name == "dsa"
    kda_names = [r.name for r in kda.TENSORS]
    block = classify(kda_names)
    assert block is not None and block.name == "kda"
    # A DSA-shaped layer that also carries every KDA name is still DSA, never KDA.
    block = classify(dsa_names + kda_names)
    assert block is not None and block.name == "dsa"


@pytest.mark.parametrize("dropped", [r.name for r in kda.TENSORS])
def test_a_kda_block_missing_one_tensor_is_unknown_never_kda(dropped: str) -> None:
    names = [r.name for r in kda.TENSORS if r.name != dropped]
    assert classify(names) is None


def test_chunk_width_is_bounded_by_the_shared_memory_ceiling() -> None:
    kda.check_constraints(REAL_KDA)  # scan_chunk = 32 fits
    lhs, _, ceiling = kda.CONSTRAINTS[1].check.partition("<=")
    need = algebra.evaluate(algebra.parse(lhs), {"scan_chunk": 64, "linear_head_dim": 128})
    assert need == 81920, "scan_chunk=64 needs 81920 B of shared memory"
    assert int(ceiling) < 81920
    with pytest.raises(GeometryError, match=r"scan_shared_memory.*refused, not truncated"):
        kda.check_constraints(dataclasses.replace(REAL_KDA, scan_chunk=64))


def test_scan_tile_constraint_names_itself_and_its_reason() -> None:
    with pytest.raises(GeometryError, match=r"scan_tile .*tiles 256 channels"):
        kda.check_constraints(dataclasses.replace(REAL_KDA, linear_heads=3, linear_head_dim=16))


def test_every_unknown_self_attn_tensor_is_listed_in_one_error() -> None:
    arrays = layer_arrays(kda, TINY_KDA)
    extra = np.zeros(4, dtype=np.float32)
    src = source(arrays, self_attn__rogue=extra, self_attn__q_proj__weight_scale=extra)
    with pytest.raises(BindError) as e:
        kda.bind_kda(TINY_KDA, 7, src)
    msg = str(e.value)
    assert msg.startswith("layer 7: 2 unrecognised self_attn tensor(s)")
    assert "self_attn.rogue" in msg and "self_attn.q_proj.weight_scale" in msg
    assert "refuses to skip anything" in msg


@pytest.mark.parametrize("dropped", ["self_attn.q_proj.weight", "self_attn.A_log"])
def test_a_missing_tensor_names_the_layer_and_the_tensor(dropped: str) -> None:
    arrays = layer_arrays(kda, TINY_KDA)
    del arrays[dropped]
    with pytest.raises(BindError, match=f"^layer 5: missing {dropped} "):
        kda.bind_kda(TINY_KDA, 5, source(arrays))


@pytest.mark.parametrize("name", ["self_attn.A_log", "self_attn.dt_bias"])
def test_casting_a_gate_parameter_to_bf16_is_refused_because_it_changes_the_gate(name: str) -> None:
    arrays = layer_arrays(kda, TINY_KDA)
    import ml_dtypes

    arrays[name] = arrays[name].astype(ml_dtypes.bfloat16)
    with pytest.raises(BindError) as e:
        kda.bind_kda(TINY_KDA, 2, source(arrays))
    assert f"layer 2: {name} is BF16 but a kda block requires F32" in str(e.value)
    assert "would change the gate" in str(e.value)


def test_a_bf16_projection_stored_as_f32_is_refused_not_cast() -> None:
    arrays = layer_arrays(kda, TINY_KDA)
    arrays["self_attn.o_norm.weight"] = arrays["self_attn.o_norm.weight"].astype(np.float32)
    with pytest.raises(BindError, match=r"o_norm\.weight is F32 but a kda block requires BF16"):
        kda.bind_kda(TINY_KDA, 0, source(arrays))


def test_a_shape_mismatch_is_refused() -> None:
    arrays = layer_arrays(kda, TINY_KDA)
    q = arrays["self_attn.q_proj.weight"]
    arrays["self_attn.q_proj.weight"] = q.reshape(q.shape[1], q.shape[0])  # [Q, X] -> [X, Q]
    with pytest.raises(BindError, match=r"q_proj.weight has shape \[8, 128\], expected \[128, 8\]"):
        kda.bind_kda(TINY_KDA, 0, source(arrays))


def test_a_conv_stored_squeezed_is_refused_as_a_shape_mismatch() -> None:
    arrays = layer_arrays(kda, TINY_KDA)
    c = arrays["self_attn.k_conv1d.weight"]
    arrays["self_attn.k_conv1d.weight"] = c.reshape(c.shape[0], c.shape[2])  # [Q, 1, K] -> [Q, K]
    with pytest.raises(
        BindError, match=r"k_conv1d.weight has shape \[128, 4\], expected \[128, 1, 4\]"
    ):
        kda.bind_kda(TINY_KDA, 0, source(arrays))


def test_a_byte_count_mismatch_is_refused() -> None:
    arrays = layer_arrays(kda, TINY_KDA)
    tensors = {n: raw(a) for n, a in arrays.items()}
    t = tensors["self_attn.f_a_proj.weight"]
    tensors["self_attn.f_a_proj.weight"] = dataclasses.replace(t, data=t.data[:-2])
    with pytest.raises(
        BindError, match=r"f_a_proj.weight is 1022 B, shape \[64, 8\] implies 1024 B"
    ):
        kda.bind_kda(TINY_KDA, 0, DictSource(tensors))


def test_conv_is_q_k_v_concatenated_in_that_order_and_squeezed_once() -> None:
    arrays = layer_arrays(kda, TINY_KDA)
    w, _ = kda.bind_kda(TINY_KDA, 0, source(arrays))
    q = TINY_KDA.linear_heads * TINY_KDA.linear_head_dim
    assert w.conv.shape == (3 * q, TINY_KDA.conv_kernel)
    for i, part in enumerate(["q", "k", "v"]):
        want = arrays[f"self_attn.{part}_conv1d.weight"][:, 0, :]  # [Q, 1, K] -> [Q, K]
        assert np.array_equal(w.conv[i * q : (i + 1) * q].view(np.uint16), want.view(np.uint16))


def test_the_squeeze_moves_no_bytes() -> None:
    arrays = layer_arrays(kda, TINY_KDA)
    w, _ = kda.bind_kda(TINY_KDA, 0, source(arrays))
    joined = b"".join(arrays[f"self_attn.{p}_conv1d.weight"].tobytes() for p in "qkv")
    assert w.conv.tobytes() == joined


def test_weights_are_kept_verbatim_with_no_casts() -> None:
    arrays = layer_arrays(kda, TINY_KDA)
    w, _ = kda.bind_kda(TINY_KDA, 0, source(arrays))
    got = w.arrays()
    for out_field, name in [("a_log", "self_attn.A_log"), ("dt_bias", "self_attn.dt_bias"),
                            ("q_proj", "self_attn.q_proj.weight"), ("o_proj", "self_attn.o_proj.weight")]:  # fmt: skip
        assert got[out_field].dtype == arrays[name].dtype
        assert got[out_field].tobytes() == arrays[name].tobytes()
    assert got["a_log"].dtype == np.float32 and got["dt_bias"].dtype == np.float32
    assert set(got) == {"q_proj", "k_proj", "v_proj", "conv", "f_a", "f_b", "dt_bias", "a_log",
                        "b_proj", "g_a", "g_b", "o_norm", "o_proj"}  # fmt: skip


def test_the_report_counts_attention_and_other_tensors_and_bytes() -> None:
    arrays = layer_arrays(kda, TINY_KDA)
    other = np.zeros(8, dtype=np.float32)
    src = source(arrays, input_layernorm__weight=other, mlp__gate_proj__weight=other)
    _, rep = kda.bind_kda(TINY_KDA, 4, src)
    assert (rep.index, rep.kind, rep.bound, rep.seen, rep.other) == (
        4,
        "kda",
        15,
        15,
        2,
    )
    assert rep.bytes == sum(a.nbytes for a in arrays.values())
