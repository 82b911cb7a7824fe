"""``fill(..., adopt=arena)``: host parameters take the fields' memory as their storage (each
byte of the rank written once, by the bind), and every parameter holds the bytes a copying
``fill`` gives it; what may not be adopted (a parameter that is not contiguous or shares its
storage, a field that is part of a larger buffer) is copied into, as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_params import bits, copied_params, params_for, tiny_llama

from specbind.engine import bind_for_engine, fill
from specbind.engine_ops import padded_share
from specbind.runtime.binder.backends import Arena

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory, "adopt")  # vocab 112: padded to 128


@pytest.mark.parametrize(("tp", "rank"), [(1, 0), (2, 0), (2, 1)])
def test_every_parameter_adopts_its_fields_memory_and_holds_the_copied_bytes(
    llama: Path, tp: int, rank: int
) -> None:
    want = copied_params(llama, tp, rank)
    arena = Arena(separate=True)
    fields = bind_for_engine(llama, "vllm", tp_size=tp, tp_rank=rank, into=arena)
    params = params_for(fields)
    objects = {n: p for n, p in params.items()}
    assert fill("vllm", params, fields, adopt=arena) == sum(f.array.nbytes for f in fields.values())
    for n, p in params.items():
        assert p is objects[n]  # the engine's parameter object, its storage replaced
        assert p.data_ptr() == fields[n].array.ctypes.data, n  # the field's memory: no copy
        assert np.array_equal(bits(p), bits(want[n])), n


def test_a_parameter_sharing_its_storage_or_not_contiguous_is_copied_into(llama: Path) -> None:
    arena = Arena(separate=True)
    fields = bind_for_engine(llama, "vllm", into=arena)
    params = params_for(fields)
    q = "model.layers.0.self_attn.qkv_proj.weight"
    o = "model.layers.0.self_attn.o_proj.weight"
    base = torch.zeros(2, *params[q].shape, dtype=torch.bfloat16)
    params[q] = torch.nn.Parameter(base[0], False)  # two parameters over one storage
    other = "model.layers.1.self_attn.qkv_proj.weight"
    params[other] = torch.nn.Parameter(base[1], False)
    rows, cols = params[o].shape
    params[o] = torch.nn.Parameter(torch.zeros(cols, rows, dtype=torch.bfloat16).T, False)
    before = {n: params[n].data_ptr() for n in (q, other, o)}
    fill("vllm", params, fields, adopt=arena)
    for n in (q, other, o):
        assert params[n].data_ptr() == before[n], n  # kept its storage
        want = np.ascontiguousarray(fields[n].array).view(np.int16)
        assert np.array_equal(bits(params[n]), want), n
    assert params["model.layers.1.self_attn.o_proj.weight"].data_ptr() == (
        fields["model.layers.1.self_attn.o_proj.weight"].array.ctypes.data
    )  # the others are adopted


def test_a_field_that_is_part_of_a_buffer_or_of_another_arena_is_copied_not_adopted(
    llama: Path,
) -> None:
    plain = Arena()
    fields = bind_for_engine(llama, "vllm", into=plain)  # one chunk holds the fields
    params = params_for(fields)
    before = {n: p.data_ptr() for n, p in params.items()}
    fill("vllm", params, fields, adopt=Arena(separate=True))
    carved = [n for n, f in fields.items() if plain.holds(f.array)]
    assert len(carved) == len(fields)  # the padded vocabulary's shares too
    assert all(params[n].data_ptr() == before[n] for n in carved)
    for n, p in params.items():
        assert np.array_equal(bits(p), np.asarray(fields[n].array).view(np.int16)), n


def test_a_padded_share_with_no_row_of_padding_is_the_field_itself() -> None:
    a = np.arange(128 * 3, dtype=np.int16).reshape(128, 3)
    assert padded_share(a, 0, 64, 1, 0, "p") is a  # 128 is a multiple of 64: nothing to pad
    b = padded_share(a[:112], 0, 64, 1, 0, "p")  # 112 padded to 128: a copy, then zeros
    assert b.shape == (128, 3) and np.array_equal(b[:112], a[:112]) and not b[112:].any()


def test_a_row_concat_into_an_arena_reads_its_parts_from_the_file_not_through_the_map(
    llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's fused qkv_proj and gate_up_proj are concats along rows: into an arena each part
    is read into its rows with ``preadv`` (no page of the map touched), never populated and
    copied through the map."""
    from specbind.runtime.binder import ops

    mapped: list[Any] = []
    monkeypatch.setattr(ops, "populate", lambda a: mapped.append(a))
    fields = bind_for_engine(llama, "vllm", into=Arena(separate=True))
    assert fields["model.layers.0.self_attn.qkv_proj.weight"].array.size
    assert fields["model.layers.0.mlp.gate_up_proj.weight"].array.size
    assert mapped == []


@pytest.mark.parametrize(("rank", "stored"), [(0, 64), (1, 48)])
def test_a_padded_vocabulary_share_reads_only_its_own_rows_into_the_arena(
    llama: Path, monkeypatch: pytest.MonkeyPatch, rank: int, stored: int
) -> None:
    """At tp 2 (vocab 112 padded to 128: rank 0 holds rows [0, 64), rank 1 rows [64, 112) then
    16 zero rows) the embedding and the head are each read once, the rank's stored rows alone,
    straight into a map of the arena their parameter adopts; the whole 112-row field is never
    read (no other field of the tiny Llama at tp 2 has 64 rows of the hidden size)."""
    from specbind.runtime.io import safetensors_file

    reads: list[tuple[int, ...]] = []
    real = safetensors_file.read_view

    def counted(dest: Any, src: Any) -> bool:
        reads.append(tuple(dest.shape))
        return real(dest, src)

    monkeypatch.setattr(safetensors_file, "read_view", counted)
    arena = Arena(separate=True)
    fields = bind_for_engine(llama, "vllm", tp_size=2, tp_rank=rank, into=arena)
    want = bind_for_engine(llama, "vllm", tp_size=2, tp_rank=rank)
    hidden = fields["lm_head.weight"].array.shape[1]
    for n in ("model.embed_tokens.weight", "lm_head.weight"):
        a = fields[n].array
        assert arena.sole(a) and a.shape == (64, hidden), n
        assert np.array_equal(a.view(np.int16), np.asarray(want[n].array).view(np.int16)), n
        assert not a[stored:].view(np.int16).any(), n  # the padding rows are zeros
    assert (112, hidden) not in reads
    if rank == 0:
        assert reads.count((64, hidden)) == 2, reads


class _Viewed(torch.nn.Module):  # type: ignore[misc]
    """A module whose buffer is a view of its parameter's storage, as vLLM's ``MambaMixer2``
    registers ``conv_weights`` over ``conv1d.weight`` (and its forward reads the buffer)."""

    def __init__(self, weight: Any) -> None:
        super().__init__()
        self.weight = weight
        self.register_buffer("viewed", weight.data.view(weight.shape[0], -1), persistent=False)
        self.alias = weight.data[:1]  # a plain tensor attribute over the same storage


@pytest.mark.parametrize("donated", [False, True])
def test_a_buffer_viewing_a_parameters_storage_sees_the_bound_values_after_an_adopting_fill(
    llama: Path, donated: bool
) -> None:
    from specbind.vllm_loader import donors

    arena = Arena(separate=True)
    probe = bind_for_engine(llama, "vllm")
    params = params_for(probe)
    q = "model.layers.0.self_attn.qkv_proj.weight"
    m = _Viewed(params[q])
    if donated:  # as vLLM's first load does: the engine's storage handed to the bind first,
        # the viewed one last (a field of another name of its size would be bound into it)
        arena.donate(donors({n: p for n, p in params.items() if n != q} | {q: params[q]}))
    fields = bind_for_engine(llama, "vllm", into=arena)
    fill("vllm", params, fields, adopt=arena)
    want = np.asarray(probe[q].array).view(np.int16)
    assert params[q] is m.weight
    assert np.array_equal(bits(m.viewed).reshape(want.shape), want)
    assert np.array_equal(bits(m.alias), want[:1])
    assert m.viewed.data_ptr() == m.weight.data_ptr()  # one storage, as vLLM's own loader keeps
    others = [n for n in params if n != q and params[n].data_ptr() == fields[n].array.ctypes.data]
    assert len(others) == len(params) - 1  # every other parameter still adopts its field
