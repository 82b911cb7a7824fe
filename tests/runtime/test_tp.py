"""Tensor parallelism: plans from the spec, this rank's bytes only, and the math still holds."""

from __future__ import annotations

import dataclasses
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import (
    REAL,
    REAL_KDA,
    TABLE,
    TINY,
    dsa_tp_geometries,
    kda_tp_geometries,
    layer_arrays,
    raw,
    source,
)
from hypothesis import given
from hypothesis import strategies as st

from specbind.core.errors import BindError, GeometryError
from specbind.core.planning import Ranks
from specbind.generated import dsa, kda
from specbind.generated import model_glm_5_3_flash as m
from specbind.launcher import resolve_tp
from specbind.runtime.binder.tp import ShardedSource, shard_raw
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.io.source import DictSource, RawTensor
from specbind.synth import synth

MODULES: dict[str, Any] = {"kda": kda, "dsa": dsa}
SMALL_KDA = kda.KdaGeometry(
    hidden=4, linear_heads=4, linear_head_dim=64, conv_kernel=2, scan_chunk=8, tp=2
)


def bind_all_ranks(module: Any, g: Any, arrays: dict[str, Any]) -> list[dict[str, Any]]:
    bind = getattr(module, f"bind_{module.BLOCK}")
    return [bind(g, 0, source(arrays), r)[0].arrays() for r in range(g.tp)]


def test_the_plan_follows_the_spec_shard_rules() -> None:
    kinds = {n: t.kind for n, t in kda.plan(dataclasses.replace(REAL_KDA, tp=2)).tensors.items()}
    rows = {
        "q_proj",
        "k_proj",
        "v_proj",
        "q_conv1d",
        "k_conv1d",
        "v_conv1d",
        "f_b_proj",
        "g_b_proj",
        "b_proj",
    }
    assert {n for n, k in kinds.items() if k == "rows"} == {f"self_attn.{n}.weight" for n in rows} | {
        "self_attn.A_log", "self_attn.dt_bias"}  # fmt: skip
    assert {n for n, k in kinds.items() if k == "replicated"} == {
        "self_attn.f_a_proj.weight", "self_attn.g_a_proj.weight", "self_attn.o_norm.weight"}  # fmt: skip
    assert {n for n, k in kinds.items() if k == "cols"} == {"self_attn.o_proj.weight"}
    dkinds = {n: t.kind for n, t in TABLE.block("dsa").plan(REAL, Ranks(2, 0)).tensors.items()}
    assert {n for n, k in dkinds.items() if k != "replicated"} == {
        "self_attn.q_b_proj.weight", "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight"}  # fmt: skip
    assert dkinds["self_attn.o_proj.weight"] == "cols"


def test_o_proj_is_column_sliced_not_row_sliced() -> None:
    arrays = layer_arrays(kda, SMALL_KDA)
    full = arrays["self_attn.o_proj.weight"]  # [X, Q] = [4, 256]
    w1, _ = kda.bind_kda(SMALL_KDA, 0, source(arrays), rank=1)
    assert w1.o_proj.shape == (4, 128), "every row kept, half the input dim"
    assert np.array_equal(w1.o_proj.view(np.uint16), full[:, 128:].view(np.uint16))
    row_sliced = full.reshape(-1)[full.size // 2 :]  # the same byte count, taken as rows
    assert row_sliced.nbytes == w1.o_proj.nbytes
    assert not np.array_equal(row_sliced.view(np.uint16), w1.o_proj.reshape(-1).view(np.uint16))


def test_o_norm_and_the_low_rank_down_projections_are_replicated_verbatim() -> None:
    arrays = layer_arrays(kda, SMALL_KDA)
    for r in range(2):
        w, _ = kda.bind_kda(SMALL_KDA, 0, source(arrays), rank=r)
        for f, n in [
            ("o_norm", "o_norm.weight"),
            ("f_a", "f_a_proj.weight"),
            ("g_a", "g_a_proj.weight"),
        ]:
            assert w.arrays()[f].tobytes() == arrays[f"self_attn.{n}"].tobytes()


def test_a_log_and_dt_bias_shard_at_different_granularity_at_the_real_geometry() -> None:
    p = kda.plan(dataclasses.replace(REAL_KDA, tp=2), rank=1)
    a, d = p.tensors["self_attn.A_log"], p.tensors["self_attn.dt_bias"]
    assert (a.full_shape, a.local_shape, d.full_shape, d.local_shape) == (
        (64,),
        (32,),
        (8192,),
        (4096,),
    )
    assert d.offset == a.offset * 128


def test_tp1_is_the_identity_and_needs_no_all_reduce() -> None:
    p = kda.plan(REAL_KDA, 0)
    assert not p.all_reduce
    assert all(
        t.local_shape == t.full_shape and t.local_bytes == t.full_bytes for t in p.tensors.values()
    )
    assert kda.plan(dataclasses.replace(REAL_KDA, tp=2), 0).all_reduce


def test_the_local_shape_keeps_the_on_disk_rank() -> None:
    p = kda.plan(dataclasses.replace(REAL_KDA, tp=2), 1)
    assert p.tensors["self_attn.q_conv1d.weight"].local_shape == (4096, 1, 4)
    assert p.tensors["self_attn.o_proj.weight"].local_shape == (4096, 4096)
    assert p.tensors["self_attn.o_norm.weight"].local_shape == (128,)


def test_a_size_mismatch_is_refused_not_truncated() -> None:
    t = kda.plan(dataclasses.replace(REAL_KDA, tp=2), 0).tensors["self_attn.q_proj.weight"]
    short = RawTensor("BF16", t.full_shape, memoryview(bytes(t.full_bytes - 2)))
    with pytest.raises(BindError, match=r"layer 3: self_attn\.q_proj\.weight is 67108862 B"):
        shard_raw(t, short, 3)


def test_the_sharded_source_passes_unplanned_names_through_so_unknowns_are_still_refused() -> None:
    arrays = layer_arrays(kda, SMALL_KDA)
    src = source(
        arrays,
        self_attn__extra=np.zeros(2, np.float32),
        input_layernorm__weight=np.ones(4, np.float32),
    )
    sharded = ShardedSource(src, kda.plan(SMALL_KDA, 1), 0)
    extra = sharded.get("input_layernorm.weight")
    assert extra is not None and extra.shape == (4,)
    assert sorted(sharded.names()) == sorted(src.names())
    with pytest.raises(
        BindError, match=r"unrecognised self_attn tensor\(s\): \['self_attn.extra'\]"
    ):
        kda.bind_kda(SMALL_KDA, 0, src, rank=1)


def test_the_per_rank_conv_is_q_local_k_local_v_local_not_a_slice_of_the_global_concat() -> None:
    arrays = layer_arrays(kda, SMALL_KDA)
    w1, _ = kda.bind_kda(SMALL_KDA, 0, source(arrays), rank=1)
    q_local = SMALL_KDA.linear_heads * SMALL_KDA.linear_head_dim // 2
    parts = [arrays[f"self_attn.{p}_conv1d.weight"][q_local:, 0, :] for p in "qkv"]  # rank 1's rows
    assert np.array_equal(w1.conv.view(np.uint16), np.concatenate(parts).view(np.uint16))
    w_tp1, _ = kda.bind_kda(dataclasses.replace(SMALL_KDA, tp=1), 0, source(arrays))
    naive = w_tp1.conv[w_tp1.conv.shape[0] // 2 :]
    assert not np.array_equal(naive.view(np.uint16), w1.conv.view(np.uint16))


def test_a_row_shard_is_a_zero_copy_view_of_the_source_bytes() -> None:
    arrays = layer_arrays(kda, SMALL_KDA)
    src = source(arrays)
    sharded = ShardedSource(src, kda.plan(SMALL_KDA, 1), 0)
    full = src.get("self_attn.q_proj.weight")
    local = sharded.get("self_attn.q_proj.weight")
    assert full is not None and local is not None
    shared = np.shares_memory(
        np.frombuffer(local.data, np.uint8), np.frombuffer(full.data, np.uint8)
    )
    assert shared, "a slice of the same buffer, not a copy"
    assert len(local.data) == len(full.data) // 2


def test_a_file_backed_column_shard_reads_the_same_bytes_as_the_mapped_gather(
    tmp_path: Path,
) -> None:
    synth(TABLE, tmp_path / "ck", TINY, layers=4)
    ck = CheckpointDir(tmp_path / "ck")
    for name, rank in [
        ("layers.0.self_attn.o_proj.weight", 5),
        ("layers.3.self_attn.o_proj.weight", 2),
    ]:
        t = ck.get(name)
        assert t is not None and t.span is not None
        block = kda if ".0." in name else dsa
        g = m.kda_geometry if block is kda else m.dsa_geometry
        geo = g(TABLE.make_geometry(TABLE.default_values() | TINY), Ranks(8, rank))
        p = block.plan(geo, rank).tensors["self_attn.o_proj.weight"]
        by_file = shard_raw(p, t, 0)
        by_map = shard_raw(p, dataclasses.replace(t, span=None), 0)
        assert bytes(by_file.data) == bytes(by_map.data) and by_file.shape == by_map.shape


def test_binding_at_tp8_allocates_about_one_eighth_of_the_layer() -> None:
    g = kda.KdaGeometry(
        hidden=512, linear_heads=64, linear_head_dim=64, conv_kernel=4, scan_chunk=16, tp=8
    )
    arrays = layer_arrays(kda, dataclasses.replace(g, tp=1))
    src = source(arrays)
    full_bytes = sum(a.nbytes for a in arrays.values())
    tracemalloc.start()
    w, rep = kda.bind_kda(g, 0, src, rank=3)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert rep.bytes == sum(a.nbytes for a in w.arrays().values())
    assert rep.bytes < full_bytes / 7
    # Only the conv concat and the o_proj column gather allocate; row shards are views.
    assert peak < 2 * rep.bytes, (peak, rep.bytes, full_bytes)


def test_a_tp_the_heads_do_not_divide_is_refused_naming_the_tensor() -> None:
    with pytest.raises(
        GeometryError,
        match=r"self_attn\.q_b_proj\.weight shards rows on heads = 64 units, which tp 3 does not divide",
    ):
        TABLE.block("dsa").plan(REAL, Ranks(3, 0))


def test_the_kda_tile_constraint_is_checked_at_the_planned_tp() -> None:
    g = dataclasses.replace(
        REAL_KDA, tp=128, linear_heads=128, linear_head_dim=64
    )  # 2 · 1 · 64 = 128 channels
    with pytest.raises(GeometryError, match=r"constraint scan_tile .* tiles 256 channels"):
        kda.bind_kda(g, 0, DictSource({}))


@pytest.mark.parametrize(
    ("flags", "env", "want"),
    [
        ((None, None), {}, (1, 0)),
        ((None, None), {"WORLD_SIZE": "4", "RANK": "3"}, (4, 3)),
        ((None, None), {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}, (2, 1)),
        ((8, 5), {"WORLD_SIZE": "4", "RANK": "3"}, (8, 5)),
        ((2, None), {"WORLD_SIZE": "4", "RANK": "1"}, (2, 1)),
    ],
)
def test_tp_comes_from_flags_then_torchrun_then_mpirun(
    flags: tuple[int | None, int | None], env: dict[str, str], want: tuple[int, int]
) -> None:
    assert resolve_tp(*flags, env) == want


@pytest.mark.parametrize(
    ("flags", "env", "fragment"),
    [((None, None), {"WORLD_SIZE": "four"}, "WORLD_SIZE='four' is not an integer"),
     ((2, 2), {}, r"tp rank 2 is outside \[0, 2\)"), ((0, 0), {}, "tp size 0 must be >= 1")],
)  # fmt: skip
def test_a_bad_tp_is_refused(
    flags: tuple[int | None, int | None], env: dict[str, str], fragment: str
) -> None:
    with pytest.raises(GeometryError, match=fragment):
        resolve_tp(*flags, env)


# --- Hypothesis: every geometry that meets the constraints, tp in {1, 2, 4, 8} -----------------


def _geometries() -> st.SearchStrategy[tuple[str, Any]]:
    return st.one_of(
        kda_tp_geometries().map(lambda g: ("kda", g)), dsa_tp_geometries().map(lambda g: ("dsa", g))
    )


@given(_geometries(), st.integers(0, 999))
def test_the_shards_of_every_tensor_partition_it_and_rejoin_in_order(
    bg: tuple[str, Any], seed: int
) -> None:
    block, g = bg
    module = MODULES[block]
    arrays = layer_arrays(module, dataclasses.replace(g, tp=1), seed=seed)
    plans = [module.plan(g, r) for r in range(g.tp)]
    for name, full in arrays.items():
        shards = [shard_raw(p.tensors[name], raw(full), 0) for p in plans]
        kind = plans[0].tensors[name].kind
        if kind == "replicated":
            assert all(bytes(s.data) == full.tobytes() for s in shards)
            continue
        assert sum(len(s.data) for s in shards) == full.nbytes, "the shards partition the tensor"
        parts = [np.frombuffer(s.data, dtype=full.dtype).reshape(s.shape) for s in shards]
        axis = 0 if kind == "rows" else full.ndim - 1
        assert np.concatenate(parts, axis=axis).tobytes() == full.tobytes(), "and rejoin in order"


@given(_geometries())
def test_tp1_plans_are_the_identity(bg: tuple[str, Any]) -> None:
    block, g = bg
    p = MODULES[block].plan(dataclasses.replace(g, tp=1), 0)
    assert not p.all_reduce
    assert all(t.local_shape == t.full_shape and t.offset == 0 for t in p.tensors.values())


@given(kda_tp_geometries(), st.data())
def test_dt_bias_offset_is_head_dim_times_a_log_offset(
    g: kda.KdaGeometry, data: st.DataObject
) -> None:
    p = kda.plan(g, data.draw(st.integers(0, g.tp - 1)))
    assert (
        p.tensors["self_attn.dt_bias"].offset
        == g.linear_head_dim * p.tensors["self_attn.A_log"].offset
    )


@given(kda_tp_geometries().filter(lambda g: g.tp > 1 and g.hidden > 1), st.data())
def test_an_o_proj_column_shard_differs_from_a_row_slice_of_the_same_size(
    g: kda.KdaGeometry, data: st.DataObject
) -> None:
    arrays = layer_arrays(kda, dataclasses.replace(g, tp=1), seed=data.draw(st.integers(0, 99)))
    rank = data.draw(st.integers(0, g.tp - 1))
    w, _ = kda.bind_kda(g, 0, source(arrays), rank)
    flat = arrays["self_attn.o_proj.weight"].reshape(-1)  # [X·Q] row-major
    n = w.o_proj.size
    row_slice = flat[rank * n : (rank + 1) * n]
    assert not np.array_equal(row_slice.view(np.uint16), w.o_proj.reshape(-1).view(np.uint16))


@given(_geometries(), st.integers(0, 999))
def test_sharded_projections_compute_the_unsharded_product(bg: tuple[str, Any], seed: int) -> None:
    """Row shards: concatenate the partial outputs. Column shards: sum the partial products."""
    block, g = bg
    module = MODULES[block]
    arrays = layer_arrays(module, dataclasses.replace(g, tp=1), seed=seed)
    ranks = bind_all_ranks(module, g, arrays)
    plan = module.plan(g, 0)
    rng = np.random.default_rng(seed)
    verbatim = [f for f, rule in module.FIELDS.items() if rule.kind == "verbatim"]
    for field, (src,) in ((f, module.SOURCES[f]) for f in verbatim):
        t = plan.tensors[src]
        full = arrays[src].astype(np.float64)
        if t.kind == "replicated" or full.ndim != 2:
            continue
        x = rng.standard_normal(full.shape[1])
        want = full @ x
        if t.kind == "rows":
            got = np.concatenate([r[field].astype(np.float64) @ x for r in ranks])
        else:
            cols = np.split(x, g.tp)  # rank r multiplies its own slice of the input
            got = sum(r[field].astype(np.float64) @ xr for r, xr in zip(ranks, cols, strict=True))
        np.testing.assert_allclose(
            got, want, rtol=1e-9, atol=1e-9, err_msg=f"{block}.{field} tp={g.tp}"
        )


@given(st.sampled_from([2, 4, 8]), st.integers(1, 64), st.sampled_from([16, 32, 64, 128]))
def test_a_geometry_that_breaks_a_constraint_is_refused_never_bound(
    tp: int, heads: int, d: int
) -> None:
    g = kda.KdaGeometry(
        hidden=2, linear_heads=heads, linear_head_dim=d, conv_kernel=2, scan_chunk=4, tp=tp
    )
    ok = heads % tp == 0 and (2 * (heads // tp) * d) % 256 == 0
    arrays = layer_arrays(kda, dataclasses.replace(g, tp=1))
    if ok:
        w, _ = kda.bind_kda(g, 0, source(arrays), 0)
        assert w.q_proj.shape[0] == heads * d // tp
    else:
        with pytest.raises(GeometryError):
            kda.bind_kda(g, 0, source(arrays), 0)
