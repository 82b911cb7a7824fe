"""The whole-slice bench row, on the bench's tiny slice: the hand-written vLLM-style loader loads
every field of every block (attention, dense and MoE MLPs, norms, mHC, embedding, final norm,
LM head) exactly as specbind binds it, at several tp and ep ranks, so the whole-process race
is equal work; and the race refuses to report when the two sides copied different bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import process
from benchmarks.baselines import vllm_style
from specbind.core.errors import SpecbindError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

TABLE = MODELS["glm-5.3-flash"]


@pytest.fixture(scope="module")
def ck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from benchmarks import main as bench

    ckpt, _ = bench.ensure_checkpoint(TABLE, tmp_path_factory.mktemp("benchwhole"), tiny=True)
    return ckpt


@pytest.mark.parametrize(
    ("tp", "rank", "ep", "ep_rank"),
    [(1, 0, 1, 0), (2, 1, 1, 0), (8, 7, 1, 0), (8, 3, 1, 0), (1, 0, 2, 1), (2, 0, 2, 0)],
)
def test_the_vllm_style_loader_loads_every_field_of_the_slice_as_specbind_binds_it(
    ck: Path, tp: int, rank: int, ep: int, ep_rank: int
) -> None:
    got = process.check(ck, TABLE, tp, rank, ep, ep_rank)
    bound = bind_checkpoint(
        CheckpointDir(ck), TABLE, tp_size=tp, tp_rank=rank, ep_size=ep, ep_rank=ep_rank,
        progress=False,
    ).fields()  # fmt: skip
    assert got["fields"] == len(bound) == 99  # every field of the slice, none left unchecked
    blocks = {b for _, b in got["blocks"]}
    assert blocks == {"kda", "dsa", "dense", "moe", "layer_norms", "mhc", "lm_globals"}
    assert (-1, "lm_globals") in got["blocks"]


def test_a_loader_that_reads_the_wrong_rank_of_one_tensor_is_refused(
    ck: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    row_view = vllm_style.Loader.row_view

    def other_rank(self: Any, name: str, tp: int, rank: int) -> Any:
        wrong = name == "embed_tokens.weight"
        return row_view(self, name, tp, (rank + 1) % tp if wrong else rank)

    monkeypatch.setattr(vllm_style.Loader, "row_view", other_rank)
    with pytest.raises(SpecbindError, match=r"baseline globals\.embed_tokens differs"):
        process.check(ck, TABLE, 2, 0)


def test_the_whole_process_row_copies_every_byte_of_the_rank_on_both_sides(ck: Path) -> None:
    row = process.row(ck, TABLE, 2, 1)
    bound = bind_checkpoint(CheckpointDir(ck), TABLE, tp_size=2, progress=False).fields()
    assert row["bytes"] == sum(np.asarray(a).nbytes for _, a in bound.values())
    assert row["fields"] == len(bound)
    assert row["specbind_min_s"] > 0 and row["baseline_min_s"] > 0
    assert row["rss_specbind_mb"] > 0 and row["rss_baseline_mb"] > 0
    shown = "\n".join(process.render([row]))
    assert "| 2 | off | 99 | " in shown and "| 2 | default (" in shown
    assert row["modes"].keys() == {"off", "default"} and row["thp"] == "off"
    assert row["specbind_s"] == row["modes"]["off"]["specbind_s"]


def test_the_thp_off_sides_run_with_huge_pages_disabled_and_the_default_sides_do_not() -> None:
    assert process.child_thp_disabled("off")
    assert not process.child_thp_disabled("default")


def test_an_unknown_thp_mode_is_refused_by_name(ck: Path) -> None:
    with pytest.raises(SpecbindError, match=r"thp mode 'never' is not one of off, default"):
        process.row(ck, TABLE, 2, 1, thp=("never",))


def test_the_whole_process_row_refuses_sides_that_copied_different_bytes(
    ck: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skips_the_head = process.BASELINE.replace(
        "for i, block in {blocks!r}:", "for i, block in {blocks!r}[:-1]:"
    )
    assert skips_the_head != process.BASELINE
    monkeypatch.setattr(process, "BASELINE", skips_the_head)
    with pytest.raises(SpecbindError, match="copied out different byte counts"):
        process.row(ck, TABLE, 8, 1)


def test_a_computed_field_is_compared_chunk_by_chunk_against_the_largest_magnitude_of_all() -> None:
    import ml_dtypes

    from benchmarks import equal

    want = np.linspace(-1.0, 1.0, 40).reshape(5, 8).astype(ml_dtypes.bfloat16)
    got = want.copy()
    got[4, 7] = np.nextafter(got[4, 7], np.inf)  # one BF16 ulp off, in the last chunk
    got[0, 1] = want[0, 1] * (1 + 2**-6)  # several ulps, and far past 2**-16 of the max: refused
    with pytest.raises(SpecbindError, match="more than 1 BF16 ulp"):
        equal._beyond_one_ulp(got, want, "q_absorb", chunk=3)
    got[0, 1] = want[0, 1]
    tiny = np.zeros_like(want)
    tiny[0, 0] = ml_dtypes.bfloat16(1.0)  # the largest magnitude, in the first chunk only:
    near = tiny.copy()
    near[3, 3] = ml_dtypes.bfloat16(2.0**-20)  # past 1 ulp of 0, within 2**-16 of that 1.0,
    # which a per-chunk maximum (0 in this chunk) would refuse
    assert equal._beyond_one_ulp(near, tiny, "q_absorb", chunk=3) == 1
    assert equal._beyond_one_ulp(got, want, "q_absorb", chunk=3) == 0  # 1 ulp is not beyond
    wide = equal.check_equal({"l.a.q_absorb": near}, {"l.a.q_absorb": tiny}, {"q_absorb"})
    assert wide == {"l.a.q_absorb": 1}
