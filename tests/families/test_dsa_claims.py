"""DSA block: the full and the "shared" (indexer-less) forms, and the MTP layer."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import INDEXER_FIELDS, REAL, TINY_DSA, classify, layer_arrays, source

from specbind.core.errors import BindError, GeometryError
from specbind.core.planning import Ranks
from specbind.generated import dsa
from specbind.generated import model_glm_5_3_flash as m


def test_dsa_spec_has_the_mla_tensors_and_the_seven_indexer_tensors() -> None:
    shapes = dsa.expected_shapes(m.dsa_geometry(REAL, Ranks()))
    assert shapes == {
        "self_attn.q_a_proj.weight": (1536, 4096),
        "self_attn.q_a_layernorm.weight": (1536,),
        "self_attn.q_b_proj.weight": (64 * 256, 1536),
        "self_attn.kv_a_proj_with_mqa.weight": (512, 4096),
        "self_attn.kv_a_layernorm.weight": (512,),
        "self_attn.kv_b_proj.weight": (64 * 512, 512),
        "self_attn.o_proj.weight": (4096, 64 * 256),
        "self_attn.indexer.wq_b.weight": (32 * 128, 1536),
        "self_attn.indexer.wk.weight": (128, 4096),
        "self_attn.indexer.k_norm.weight": (128,),
        "self_attn.indexer.k_norm.bias": (128,),
        "self_attn.indexer.weights_proj.weight": (32, 4096),
        "self_attn.indexer.index_kpool_compress_gate": (128, 4096),
        "self_attn.indexer.index_kpool_compress_ape": (16, 128),
    }
    assert all(r.dtype == "BF16" for r in dsa.TENSORS)
    assert sum(r.group == "indexer" for r in dsa.TENSORS) == 7


def test_a_full_dsa_layer_binds_every_field_and_keeps_the_untransformed_ones_verbatim() -> None:
    arrays = layer_arrays(dsa, TINY_DSA)
    w, rep = dsa.bind_dsa(TINY_DSA, 3, source(arrays))
    assert (rep.bound, rep.seen, rep.other) == (14, 14, 0)
    assert set(w.arrays()) == set(dsa.FIELDS)
    for field, rule in dsa.FIELDS.items():
        if rule.kind == "verbatim":
            (src,) = dsa.SOURCES[field]
            assert w.arrays()[field].tobytes() == arrays[src].tobytes(), field
    assert w.ape is not None and w.ape.dtype == np.float32
    assert w.q_absorb.dtype == w.o_absorb.dtype == arrays["self_attn.q_b_proj.weight"].dtype


def test_a_shared_dsa_layer_without_indexer_tensors_is_still_dsa_and_binds() -> None:
    arrays = layer_arrays(dsa, TINY_DSA, indexer=False)
    block = classify(list(arrays))
    assert block is not None and block.name == "dsa"
    w, rep = dsa.bind_dsa(TINY_DSA, 7, source(arrays))
    assert (rep.bound, rep.seen) == (7, 7)
    assert all(getattr(w, f) is None for f in INDEXER_FIELDS)
    assert set(w.arrays()) == {"q_a_proj", "q_a_layernorm", "q_absorb", "kv_a_proj",
                               "kv_a_layernorm", "o_absorb"}  # fmt: skip


@pytest.mark.parametrize("dropped", [r.name for r in dsa.TENSORS if r.group == "indexer"])
def test_a_partial_indexer_is_refused_naming_the_missing_tensor(dropped: str) -> None:
    arrays = layer_arrays(dsa, TINY_DSA)
    del arrays[dropped]
    with pytest.raises(BindError) as e:
        dsa.bind_dsa(TINY_DSA, 3, source(arrays))
    assert f"layer 3: partial indexer group in a dsa block: missing ['{dropped}']" in str(e.value)


def test_the_mtp_layer_with_extra_non_attention_tensors_binds_as_dsa() -> None:
    arrays = layer_arrays(dsa, TINY_DSA)
    x = np.zeros(4, dtype=np.float32)
    src = source(arrays, eh_proj__weight=x, enorm__weight=x, hnorm__weight=x)
    _, rep = dsa.bind_dsa(TINY_DSA, 45, src)
    assert (rep.kind, rep.bound, rep.other) == ("dsa", 14, 3)


def test_a_rope_dim_is_in_the_shapes_but_the_nope_absorb_refuses_it() -> None:
    """The block itself cannot absorb a rope section: its q_b_proj view [H, N, QL] no longer
    fits, so the rope rows are refused, never dropped. (GLM's spec says R = 0 up front.)"""
    g = dataclasses.replace(TINY_DSA, qk_rope_head_dim=2)
    shapes = dsa.expected_shapes(g)
    assert shapes["self_attn.q_b_proj.weight"] == (
        g.heads * (g.qk_nope_head_dim + 2),
        g.q_lora_rank,
    )
    assert shapes["self_attn.kv_a_proj_with_mqa.weight"] == (g.kv_lora_rank + 2, g.hidden)
    arrays = layer_arrays(dsa, g)
    with pytest.raises(BindError, match=r"q_absorb: q_b_proj.weight: cannot view"):
        dsa.bind_dsa(g, 3, source(arrays))


def test_the_glm_spec_refuses_a_rope_dim_as_its_own_nope_only_constraint() -> None:
    from specbind.generated import MODELS
    from specbind.runtime.layout.config import checked_values

    table = MODELS["glm-5.3-flash"]
    assert [c.name for c in table.constraints] == ["nope_only"]
    with pytest.raises(GeometryError) as e:
        checked_values(table, table.default_values(), {"qk_rope_head_dim": 64})
    assert str(e.value).startswith(
        "glm-5.3-flash: constraint nope_only (qk_rope_head_dim == 0) fails for "
        "qk_rope_head_dim=64: NoPE only"
    )
