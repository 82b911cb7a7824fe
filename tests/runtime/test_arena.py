"""Binding into the caller's memory (``into=Arena``): every field of the result lies in the
arena, equals the plain bind's field byte for byte, and each field an op makes (a stack, a
concat, an absorb) is made there, not copied in afterwards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import TINY

import specbind
from specbind.core.errors import BindError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import ReportOnly, bind_checkpoint
from specbind.runtime.binder.backends import Arena, Backend
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.synth import synth

TABLE = MODELS["glm-5.3-flash"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("arena") / "ck"
    synth(TABLE, out, dict(TINY), layers=8, seed=5)
    return out


def _bind(ckpt: Path, tp: int, rank: int, ep: int = 1, into: Arena | None = None) -> Any:
    return bind_checkpoint(
        CheckpointDir(ckpt), TABLE, tp_size=tp, tp_rank=rank, ep_size=ep, progress=False,
        into=into,
    )  # fmt: skip


@pytest.mark.parametrize(("tp", "rank", "ep"), [(1, 0, 1), (2, 1, 1), (4, 3, 2)])
def test_every_field_bound_into_an_arena_lies_in_it_and_equals_the_plain_bind(
    ckpt: Path, tp: int, rank: int, ep: int
) -> None:
    arena = Arena(chunk_bytes=1 << 16)  # small chunks: fields spread over many
    got = _bind(ckpt, tp, rank, ep, arena).fields()
    want = _bind(ckpt, tp, rank, ep).fields()
    assert got.keys() == want.keys()
    for name, (_, a) in got.items():
        b = want[name][1]
        assert arena.holds(a), name
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name
    assert arena.used >= sum(a.nbytes for _, a in got.values())


def test_stacks_concats_and_absorbs_are_made_in_the_arena_and_only_views_are_copied_in(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copied: list[Any] = []
    place = Arena.place

    def spy(self: Arena, a: Any) -> Any:
        if a is not None and not self.holds(a):
            copied.append(a)
        return place(self, a)

    monkeypatch.setattr(Arena, "place", spy)
    arena = Arena()
    result = _bind(ckpt, 2, 0, 1, arena)
    made = {"w13", "w2", "q_absorb", "o_absorb", "shared_gate_up"}
    seen = set()
    for layer in result.layers:
        for slot in layer.slots.values():
            for name, rule in slot.fields.items():
                if name in made and name in slot.weights.arrays():
                    seen.add(name)
                    assert rule.kind != "verbatim", name
    assert seen == made  # the tiny model has every kind of made field
    # what the sweep copied in were views of the map (read-only), never an op's own result
    assert copied and all(not a.flags.writeable for a in copied)


def test_a_stacked_column_shard_family_is_gathered_straight_into_the_arena(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At tp 2 each expert's down_proj is a column shard: the gather writes it into its slot of
    one family buffer, which must be carved from the arena, so the stack is that buffer itself
    (no second copy into the arena)."""
    from specbind.runtime.binder import ops

    runs: list[Any] = []
    real = ops.stacked_run

    def spy(members: Any) -> Any:
        run = real(members)
        runs.append(run)
        return run

    monkeypatch.setattr(ops, "stacked_run", spy)
    arena = Arena()
    result = _bind(ckpt, 2, 1, 1, arena)
    moe = next(s for x in result.layers for s in x.slots.values() if s.block == "moe")
    w2 = moe.weights.w2  # [experts, hidden, expert_intermediate_r]: columns of down_proj
    gathered = [r for r in runs if r is not None]
    assert any(r is w2 for r in gathered)  # the stack returned the gathered buffer as is
    assert all(arena.holds(r) for r in gathered)


def test_reset_hands_the_same_bytes_out_again_without_growing(ckpt: Path) -> None:
    arena = Arena()
    first = _bind(ckpt, 2, 0, 1, arena).fields()
    size, used = arena.nbytes, arena.used
    addresses = [a.ctypes.data for _, a in first.values()]
    del first
    arena.reset()
    second = _bind(ckpt, 2, 0, 1, arena).fields()
    assert arena.nbytes == size and arena.used == used
    assert [a.ctypes.data for _, a in second.values()] == addresses


def test_an_arena_is_refused_with_a_streaming_sink_and_on_a_device_backend(ckpt: Path) -> None:
    with pytest.raises(BindError, match="streaming bind"):
        bind_checkpoint(CheckpointDir(ckpt), TABLE, progress=False, into=Arena(), sink=ReportOnly())
    device = Backend("cupy", np, device=True)  # type: ignore[arg-type]
    with pytest.raises(BindError, match="binds on the device"):
        bind_checkpoint(CheckpointDir(ckpt), TABLE, progress=False, into=Arena(), backend=device)


def test_arena_arrays_are_aligned_and_a_bad_chunk_size_is_refused() -> None:
    arena = Arena(chunk_bytes=1000)
    a = arena.empty((3,), np.uint8)
    b = arena.empty((5, 7), np.float32)  # 140 B: fits the first chunk after alignment
    c = arena.empty((400,), np.float32)  # 1600 B: a chunk of its own
    for x in (a, b, c):
        assert x.ctypes.data % 64 == 0 and x.flags.c_contiguous and arena.holds(x)
    assert not arena.holds(np.empty(4)) and not arena.holds([1, 2])
    assert arena.holds(b[1:3]) and arena.used == 3 + 140 + 1600
    with pytest.raises(BindError, match="chunk_bytes"):
        Arena(chunk_bytes=0)


def test_the_api_binds_into_an_arena(ckpt: Path) -> None:
    arena = specbind.Arena()
    m = specbind.open(ckpt).bind(tp_size=2, tp_rank=1, into=arena)
    want = _bind(ckpt, 2, 1).fields()
    got = m.tensors()
    assert got.keys() == want.keys()
    assert all(arena.holds(a) and a.tobytes() == want[k][1].tobytes() for k, a in got.items())


def test_torch_on_the_host_shares_the_arena_and_copies_nothing_again(ckpt: Path) -> None:
    torch = pytest.importorskip("torch")
    arena = specbind.Arena()
    m = specbind.open(ckpt).bind(tp_size=2, tp_rank=0, backend="torch", into=arena)
    used = arena.used
    for name, x in m.tensors().items():
        assert isinstance(x, torch.Tensor) and x.is_contiguous(), name
        assert arena.holds(x.view(torch.uint8).numpy()), name  # the arena's bytes, not a copy
    assert arena.used == used


def test_reserved_room_is_carved_before_the_arena_grows_and_is_not_reserved_twice() -> None:
    arena = Arena(chunk_bytes=1 << 12)
    arena.reserve(1 << 20)
    size = arena.nbytes
    assert size >= 1 << 20
    arena.reserve(1 << 19)  # fits what is free: no second chunk
    assert arena.nbytes == size
    parts = [arena.empty((1 << 16,), np.uint8) for _ in range(15)]  # 960 KiB, 64-aligned
    assert arena.nbytes == size and all(arena.holds(p) for p in parts)
    for i, p in enumerate(parts):
        p[:] = i  # the populated pages take writes like any others
    assert [int(p[0]) for p in parts] == list(range(15))


@pytest.mark.parametrize(
    ("model", "tp", "ep"),
    [
        ("glm-5.3-flash", 1, 1), ("glm-5.3-flash", 2, 1), ("glm-5.3-flash", 4, 2),
        ("deepseek-v3", 2, 2), ("gpt-oss", 2, 2), ("qwen3-moe", 2, 1),
    ],
)  # fmt: skip
def test_a_bind_into_an_arena_reserves_exactly_the_bytes_it_carves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, tp: int, ep: int
) -> None:
    """The reservation is what the bind carves (fields, and the column shards a transform
    keeps), so the background populate maps no page the bind leaves unwritten: at tp 1 the
    experts' whole ``down_proj`` is no longer given family room it never fills."""
    from specbind.runtime.binder.backends import ALIGN
    from specbind.synth import tiny_values

    table = MODELS[model]
    ck = tmp_path / "ck"
    synth(table, ck, tiny_values(table), seed=3)
    asked: list[int] = []
    reserve = Arena.reserve
    monkeypatch.setattr(Arena, "reserve", lambda self, n: (asked.append(n), reserve(self, n))[1])
    arena = Arena(chunk_bytes=1 << 12)  # tiny chunks: anything past the reservation shows
    got = bind_checkpoint(
        CheckpointDir(ck), table, tp_size=tp, ep_size=ep, progress=False, into=arena
    ).fields()
    carved = len(got) + 64  # an upper bound on the arrays carved (each padded at most ALIGN)
    assert len(asked) == 1
    assert arena.used <= asked[0] <= arena.used + ALIGN * carved
    assert len(arena._chunks) == 1  # nothing spilled past the reservation


# -- separate=True: each array in a map of its own (what an engine's parameters adopt) --------


def test_a_separate_arena_gives_each_field_a_map_of_its_own_equal_to_the_plain_bind(
    ckpt: Path,
) -> None:
    import mmap

    arena = Arena(separate=True)
    got = _bind(ckpt, 2, 1, 1, arena).fields()
    want = _bind(ckpt, 2, 1).fields()
    assert got.keys() == want.keys()
    starts = set()
    for name, (_, a) in got.items():
        assert arena.holds(a) and a.tobytes() == want[name][1].tobytes(), name
        lo, _hi = np.lib.array_utils.byte_bounds(a)
        assert lo % mmap.PAGESIZE == 0 and lo not in starts, name  # its own page-aligned map
        starts.add(lo)
    whole = [a for _, a in got.values() if a.nbytes and a.flags.c_contiguous]
    assert whole and all(arena.sole(a) for a in whole)


def test_sole_is_true_only_for_all_of_one_separate_map() -> None:
    arena = Arena(separate=True)
    a = arena.empty((6, 5), np.uint16)
    assert arena.sole(a)
    assert not arena.sole(a[1:])  # part of the map: another array could name the rest
    assert not arena.sole(a.T)  # not C-contiguous
    assert not arena.sole(np.empty((6, 5), np.uint16))  # not the arena's
    plain = Arena()
    assert not plain.sole(plain.empty((6, 5), np.uint16))  # one chunk holds many arrays


def test_a_separate_arenas_map_goes_back_when_its_last_view_goes_whatever_the_others() -> None:
    """One chunk of a plain arena lives while any array carved from it does; a separate
    arena's map lives exactly as long as its own array (the arena itself gone)."""
    import gc
    import mmap
    import weakref

    def map_of(a: Any) -> Any:  # ndarray views -> the buffer NumPy wraps -> its map
        while not isinstance(a, mmap.mmap):
            a = a.obj if isinstance(a, memoryview) else a.base
        return a

    arena = Arena(separate=True)
    a, b = arena.empty((1 << 16,), np.uint8), arena.empty((1 << 16,), np.uint8)
    ra, rb = weakref.ref(map_of(a)), weakref.ref(map_of(b))
    del arena
    del a
    gc.collect()
    assert ra() is None and rb() is not None
    assert b.sum() == 0  # still readable
