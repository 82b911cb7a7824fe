"""DSA load-time transforms: the algebra holds, each rank multiplies only its heads, and the
bytes depend neither on tp nor on the thread count."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

import helpers
import ml_dtypes
import numpy as np
import patience
import pytest
from budget import examples
from helpers import TINY_DSA, dsa_tp_geometries, layer_arrays, raw, source
from hypothesis import given, settings
from hypothesis import strategies as st

from specbind.core.dtypes import bf16_ulp, within_one_bf16_ulp
from specbind.core.errors import BindError
from specbind.generated import dsa
from specbind.runtime.binder import ops
from specbind.runtime.binder.tp import shard_raw

F64 = np.float64


def f64(a: Any) -> np.ndarray[Any, Any]:
    return np.asarray(a).astype(F64)


def reference(g: dsa.DsaGeometry, arrays: dict[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
    """The absorbed weights over all heads, in float64, straight from their definitions."""
    h, n, v, kvl, ql, x = (
        g.heads,
        g.qk_nope_head_dim,
        g.v_head_dim,
        g.kv_lora_rank,
        g.q_lora_rank,
        g.hidden,
    )
    kv_b = f64(arrays["self_attn.kv_b_proj.weight"]).reshape(
        h, n + v, kvl
    )  # [H(N+V), KVL] -> [H, N+V, KVL]
    q_b = f64(arrays["self_attn.q_b_proj.weight"]).reshape(h, n, ql)  # [HN, QL] -> [H, N, QL]
    o = f64(arrays["self_attn.o_proj.weight"]).reshape(x, h, v)  # [X, HV] -> [X, H, V]
    q_absorb = np.einsum("hrc,hrk->hck", kv_b[:, :n], q_b).reshape(
        h * kvl, ql
    )  # [H, KVL, QL] -> [H·KVL, QL]
    o_absorb = np.einsum("ihr,hrc->ihc", o, kv_b[:, n:]).reshape(
        x, h * kvl
    )  # [X, H, KVL] -> [X, H·KVL]
    return {"q_absorb": q_absorb, "o_absorb": o_absorb, "kv_b": kv_b, "q_b": q_b, "o": o}


def test_absorbed_weights_are_within_one_bf16_ulp_of_the_f64_definition() -> None:
    g = dataclasses.replace(
        TINY_DSA, heads=4, qk_nope_head_dim=5, v_head_dim=3, kv_lora_rank=6, q_lora_rank=7, hidden=9
    )
    arrays = layer_arrays(dsa, g, seed=4)
    w, _ = dsa.bind_dsa(g, 3, source(arrays))
    ref = reference(g, arrays)
    for field in ("q_absorb", "o_absorb"):
        got = f64(w.arrays()[field])
        assert w.arrays()[field].dtype == ml_dtypes.bfloat16
        assert np.all(np.abs(got - ref[field]) <= bf16_ulp(ref[field])), field


def test_weights_proj_is_scaled_by_index_heads_to_the_minus_half_and_rounded_once() -> None:
    g = dataclasses.replace(TINY_DSA, index_heads=3)
    arrays = layer_arrays(dsa, g, seed=2)
    w, _ = dsa.bind_dsa(g, 3, source(arrays))
    raw = arrays["self_attn.indexer.weights_proj.weight"]
    want = (raw.astype(np.float32) * np.float32(3**-0.5)).astype(ml_dtypes.bfloat16)
    assert w.weights_proj is not None
    assert w.weights_proj.tobytes() == want.tobytes()


def test_ape_is_widened_to_f32_exactly() -> None:
    arrays = layer_arrays(dsa, TINY_DSA, seed=3)
    w, _ = dsa.bind_dsa(TINY_DSA, 3, source(arrays))
    raw = arrays["self_attn.indexer.index_kpool_compress_ape"]
    assert w.ape is not None and w.ape.dtype == np.float32
    assert np.array_equal(w.ape.astype(ml_dtypes.bfloat16).view(np.uint16), raw.view(np.uint16))
    assert np.array_equal(w.ape, raw.astype(np.float64).astype(np.float32))


@settings(max_examples=examples(2))
@given(dsa_tp_geometries(), st.integers(0, 999))
def test_absorbed_scores_equal_the_unabsorbed_path(g: dsa.DsaGeometry, seed: int) -> None:
    """q·k per head from (q_b, kv_b_K) equals q_absorb·q_resid against the latent c."""
    g1 = dataclasses.replace(g, tp=1)
    arrays = layer_arrays(dsa, g1, seed=seed)
    w, _ = dsa.bind_dsa(g1, 0, source(arrays))
    ref = reference(g1, arrays)
    rng = np.random.default_rng(seed)
    q_resid, c = rng.standard_normal(g.q_lora_rank), rng.standard_normal(g.kv_lora_rank)
    q = np.einsum("hrk,k->hr", ref["q_b"], q_resid)  # [H, N]: the unabsorbed query
    k = np.einsum(
        "hrc,c->hr", ref["kv_b"][:, : g.qk_nope_head_dim], c
    )  # [H, N]: the key from the latent
    scores = np.einsum("hr,hr->h", q, k)
    qa = f64(w.q_absorb).reshape(
        g.heads, g.kv_lora_rank, g.q_lora_rank
    )  # [H·KVL, QL] -> [H, KVL, QL]
    absorbed = np.einsum("hck,k,c->h", qa, q_resid, c)
    # Each absorbed weight is within half a BF16 ulp (2^-9 relative) of its exact value.
    bound = 2.0**-8 * np.einsum("hck,k,c->h", np.abs(qa), np.abs(q_resid), np.abs(c)) + 1e-12
    assert np.all(np.abs(absorbed - scores) <= bound)

    v = np.einsum(
        "hrc,c->hr", ref["kv_b"][:, g.qk_nope_head_dim :], c
    )  # [H, V]: values from the latent
    out = np.einsum("ihr,hr->i", ref["o"], v)
    oa = f64(w.o_absorb).reshape(g.hidden, g.heads, g.kv_lora_rank)  # [X, H·KVL] -> [X, H, KVL]
    out_absorbed = np.einsum("ihc,c->i", oa, c)
    bound = 2.0**-8 * np.einsum("ihc,c->i", np.abs(oa), np.abs(c)) + 1e-12
    assert np.all(np.abs(out_absorbed - out) <= bound)


@settings(max_examples=examples(2))
@given(dsa_tp_geometries(), st.integers(0, 999))
def test_each_rank_absorbs_exactly_its_rows_and_columns_of_the_tp1_result(
    g: dsa.DsaGeometry, seed: int
) -> None:
    arrays = layer_arrays(dsa, dataclasses.replace(g, tp=1), seed=seed)
    full, _ = dsa.bind_dsa(dataclasses.replace(g, tp=1), 0, source(arrays))
    rows, cols = g.heads // g.tp * g.kv_lora_rank, g.heads // g.tp * g.kv_lora_rank
    for r in range(g.tp):
        w, _ = dsa.bind_dsa(g, 0, source(arrays), r)
        assert w.q_absorb.tobytes() == full.q_absorb[r * rows : (r + 1) * rows].tobytes()
        assert (
            w.o_absorb.tobytes()
            == np.ascontiguousarray(full.o_absorb[:, r * cols : (r + 1) * cols]).tobytes()
        )


def test_at_tp8_a_rank_reads_and_multiplies_one_eighth_of_the_heads() -> None:
    g = dataclasses.replace(
        TINY_DSA,
        heads=16,
        qk_nope_head_dim=8,
        v_head_dim=8,
        kv_lora_rank=16,
        q_lora_rank=32,
        hidden=24,
    )
    arrays = layer_arrays(dsa, g, seed=1)
    with ops.counting() as full:
        dsa.bind_dsa(g, 0, source(arrays))
    g8 = dataclasses.replace(g, tp=8)
    with ops.counting() as rank:
        _, rep = dsa.bind_dsa(g8, 0, source(arrays), 5)
    assert rank.flops * 8 == full.flops
    assert rank.operand_elements * 8 == full.operand_elements
    sharded = sum(
        arrays[n].nbytes
        for n in (
            "self_attn.q_b_proj.weight",
            "self_attn.kv_b_proj.weight",
            "self_attn.o_proj.weight",
        )
    )
    replicated = sum(a.nbytes for a in arrays.values()) - sharded
    assert rep.bytes == replicated + sharded // 8, (
        "the binder read 1/8 of every head-sharded tensor"
    )


def test_the_seed_order_of_work_would_multiply_every_head() -> None:
    """The hand-written loader computes q_absorb over all heads and then slices; specbind's
    per-rank op costs 1/tp of that. Shown by the generated op's cost at tp=1 and tp=4."""
    g = dataclasses.replace(TINY_DSA, heads=8)
    arrays = layer_arrays(dsa, g, seed=1)
    with ops.counting() as all_heads:
        dsa.make_q_absorb(g, arrays)
    local = ops.OpStats()
    g4 = dataclasses.replace(g, tp=4)
    for r in range(4):
        p = dsa.plan(g4, r)
        shard = {n: _local(p.tensors[n], a) for n, a in arrays.items()}
        with ops.counting() as one:
            dsa.make_q_absorb(g4, shard)
        assert one.flops * 4 == all_heads.flops
        local.flops += one.flops
    assert local.flops == all_heads.flops


def _local(plan: Any, a: Any) -> Any:
    sh = shard_raw(plan, raw(a), 0)
    return np.frombuffer(sh.data, dtype=a.dtype).reshape(sh.shape)  # [n] -> the local shape


def test_a_view_with_the_wrong_element_count_is_refused_naming_the_field() -> None:
    a = np.zeros((6, 4), dtype=np.float32)
    with pytest.raises(
        BindError,
        match=r"q_absorb: kv_b_proj.weight: cannot view \[6, 4\] \(24 elements\) as \[5, 5\]",
    ):
        ops.view(a, (5, 5), "q_absorb: kv_b_proj.weight")


def test_a_wrongly_sized_kv_b_is_refused_before_any_multiply() -> None:
    arrays = layer_arrays(dsa, TINY_DSA)
    kv_b = arrays["self_attn.kv_b_proj.weight"]
    arrays["self_attn.kv_b_proj.weight"] = kv_b[: kv_b.shape[0] - 1]  # one row short
    with ops.counting() as stats, pytest.raises(BindError, match=r"kv_b_proj\.weight has shape"):
        dsa.bind_dsa(TINY_DSA, 3, source(arrays))
    assert stats.flops == 0


@settings(max_examples=examples(0.6))
@given(dsa_tp_geometries(), st.integers(2, 6), st.integers(0, 99))
def test_the_thread_count_does_not_change_a_byte(
    g: dsa.DsaGeometry, threads: int, seed: int
) -> None:
    arrays = layer_arrays(dsa, dataclasses.replace(g, tp=1), seed=seed)
    outs = []
    for n in (1, threads):
        os.environ["SPECBIND_THREADS"] = str(n)
        try:
            w, _ = dsa.bind_dsa(g, 0, source(arrays), g.tp - 1)
        finally:
            del os.environ["SPECBIND_THREADS"]
        outs.append((w.q_absorb.tobytes(), w.o_absorb.tobytes()))
    assert outs[0] == outs[1]


SCRIPT = """
import hashlib, json, sys
sys.path.insert(0, {tests!r})
from helpers import layer_arrays, source
from specbind.generated import dsa
for fields, seed in json.loads(sys.stdin.read()):
    g = dsa.DsaGeometry(**fields)
    w, _ = dsa.bind_dsa(g, 0, source(layer_arrays(dsa, dsa.DsaGeometry(**(fields | {{"tp": 1}})), seed=seed)), g.tp - 1)
    print(hashlib.sha256(w.q_absorb.tobytes() + w.o_absorb.tobytes()).hexdigest())
"""


@settings(max_examples=examples(0.01), deadline=None)
@given(st.lists(st.tuples(dsa_tp_geometries(), st.integers(0, 99)), min_size=24, max_size=48))
def test_the_blas_thread_count_does_not_change_a_byte(
    cases: list[tuple[dsa.DsaGeometry, int]],
) -> None:
    """The same drawn layers absorbed by a process with 1 BLAS thread and one with 2. Each
    example is one pair of processes over 24-48 drawn layers: the processes' start, not the
    layers, is the cost, so many layers ride on each start."""
    payload = json.dumps([(dataclasses.asdict(g), seed) for g, seed in cases])
    digests = []
    for blas in ("1", "2"):
        env = {
            **os.environ,
            "OPENBLAS_NUM_THREADS": blas,
            "OMP_NUM_THREADS": blas,
            "MKL_NUM_THREADS": blas,
        }
        script = SCRIPT.format(tests=os.path.dirname(helpers.__file__))  # tests/support
        proc = patience.run(
            [sys.executable, "-c", script],
            input=payload,
            capture_output=True,
            text=True,
            env=env,
            cpu=120,
        )
        assert proc.returncode == 0, proc.stderr
        digests.append(proc.stdout.split())
    assert digests[0] == digests[1] and len(digests[0]) == len(cases)


def test_the_bf16_ulp_is_the_spacing_of_bf16_values() -> None:
    x = np.array([1.0, 1.5, 2.0, 0.0, 2.0**-130, -3.0])
    assert list(bf16_ulp(x)) == [2.0**-7, 2.0**-7, 2.0**-6, 2.0**-133, 2.0**-133, 2.0**-6]
    one = np.array([1.0], dtype=ml_dtypes.bfloat16)
    next_up = np.nextafter(one, np.array([2.0], dtype=ml_dtypes.bfloat16))
    assert float(next_up[0]) - 1.0 == 2.0**-7, "one ulp above 1.0 in BF16"
    assert within_one_bf16_ulp(next_up, one) and not within_one_bf16_ulp(
        np.array([1.0 + 2**-6]), one
    )


def test_a_stack_of_mapped_members_populates_their_pages_and_copies_the_same_bytes(
    tmp_path: Any,
) -> None:
    """Members over 1 MiB that view a read-only map are populated (one madvise each) before
    the copy: the stack holds exactly ``np.stack``'s bytes, and the advice was not refused
    (a refusal would turn it off for the process: ``ops._madvise`` False)."""
    import mmap

    rng = np.random.default_rng(3)
    data = rng.integers(0, 1 << 16, size=(3, 512, 1024), dtype=np.uint16)  # 3 x 1 MiB
    path = tmp_path / "members.bin"
    path.write_bytes(data.tobytes())
    with path.open("rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    mapped = np.frombuffer(m, dtype=np.uint16).reshape(3, 512, 1024)  # [members, rows, cols]
    members = [mapped[i] for i in range(3)]
    assert not members[0].flags.writeable and members[0].nbytes >= ops._POPULATE_MIN
    got = ops.stack([members], axis=0, squeeze=None)
    assert got.tobytes() == data.tobytes()
    assert ops._madvise is not False
    owned = [a.copy() for a in members]  # writable memory: skipped, same result
    assert ops.stack([owned], axis=0, squeeze=None).tobytes() == data.tobytes()
    del mapped, members
    m.close()
