"""specbind owns its threads: ``SPECBIND_THREADS`` (default: the usable cores) Python threads,
each BLAS call on one thread, and the caller's BLAS setting untouched outside specbind's work."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import patience
import pytest
from helpers import layer_arrays, source
from threadpoolctl import threadpool_info, threadpool_limits

from specbind.core.errors import GeometryError
from specbind.generated import dsa
from specbind.runtime.binder import ops

SIX_HEADS = dsa.DsaGeometry(
    hidden=16,
    heads=6,
    q_lora_rank=8,
    kv_lora_rank=8,
    qk_nope_head_dim=4,
    qk_rope_head_dim=0,
    v_head_dim=4,
    index_heads=2,
    index_head_dim=4,
    index_kpool=3,
)


def _blas_threads() -> list[int]:
    return [x["num_threads"] for x in threadpool_info() if x["user_api"] == "blas"]


def test_the_default_thread_count_is_the_cores_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SPECBIND_THREADS", raising=False)
    assert ops.threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("SPECBIND_THREADS", "3")
    assert ops.threads() == 3
    monkeypatch.setenv("SPECBIND_THREADS", "0")
    with pytest.raises(GeometryError, match=r"SPECBIND_THREADS=0 must be >= 1"):
        ops.threads()


def test_one_two_and_three_threads_give_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = layer_arrays(dsa, SIX_HEADS, seed=5)
    outs = set()
    for n in ("1", "2", "3"):
        monkeypatch.setenv("SPECBIND_THREADS", n)
        w, _ = dsa.bind_dsa(SIX_HEADS, 0, source(arrays))
        outs.add(w.q_absorb.tobytes() + w.o_absorb.tobytes())
    assert len(outs) == 1


def test_a_whole_bind_writes_the_same_file_at_one_two_and_three_threads(tmp_path: Path) -> None:
    from specbind.cli import main

    assert main(["synth", str(tmp_path / "ck"), "--layers", "4"]) == 0
    files = []
    for n in ("1", "2", "3"):
        out = tmp_path / f"t{n}.safetensors"
        proc = patience.run(
            [sys.executable, "-m", "specbind", "bind", str(tmp_path / "ck"), "--out", str(out)],
            capture_output=True, text=True, cpu=120, env={**os.environ, "SPECBIND_THREADS": n},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        files.append(out.read_bytes())
    assert files[0] == files[1] == files[2]


def test_blas_runs_on_one_thread_inside_and_as_the_caller_set_it_after() -> None:
    with threadpool_limits(limits=2, user_api="blas"):
        assert set(_blas_threads()) == {2}
        with ops.single_threaded_blas():
            assert set(_blas_threads()) == {1}
        assert set(_blas_threads()) == {2}
        g = dataclasses.replace(SIX_HEADS)
        dsa.bind_dsa(g, 0, source(layer_arrays(dsa, g)))  # runs contract
        assert set(_blas_threads()) == {2}  # the caller's numpy keeps its setting


def test_overlapping_entries_leave_the_limit_until_the_last_one_leaves() -> None:
    """Two binds whose spans overlap without nesting (A in, B in, A out, B out), as two
    threads' binds do; entered from one thread, since this OpenBLAS ignores a thread count set
    from a non-main thread once the main thread has set one (see ops.single_threaded_blas)."""
    with threadpool_limits(limits=2, user_api="blas"):
        a, b = ops.single_threaded_blas(), ops.single_threaded_blas()
        a.__enter__()
        b.__enter__()
        a.__exit__(None, None, None)
        assert set(_blas_threads()) == {1}  # B is still working
        b.__exit__(None, None, None)
        assert set(_blas_threads()) == {2}


def test_a_contraction_is_the_same_under_any_caller_blas_setting() -> None:
    a = np.random.default_rng(0).standard_normal((4, 32, 64)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((4, 64, 16)).astype(np.float32)
    outs = []
    for blas in (1, 2):
        with threadpool_limits(limits=blas, user_api="blas"):
            r = ops.contract(a, b, einsum="hlc,hcr->hlr", dtype="F32")
            outs.append(r.tobytes())
    assert outs[0] == outs[1]


def test_a_blas_loaded_after_the_first_limit_is_limited_too() -> None:
    """SciPy loads an OpenBLAS of its own beside NumPy's: imported after a bind has run, the
    next bind still runs it on one thread (in a fresh process, so that SciPy is not yet loaded)."""
    if importlib.util.find_spec("scipy") is None:  # not imported here: it brings its BLAS
        pytest.skip("SciPy is not installed (the quant extra brings it)")
    code = (
        "from threadpoolctl import threadpool_info, threadpool_limits\n"
        "from specbind.runtime.binder import ops\n"
        "with ops.single_threaded_blas():\n"
        "    pass\n"
        "import scipy.linalg\n"
        "blas = lambda: [x['num_threads'] for x in threadpool_info() if x['user_api'] == 'blas']\n"
        "with threadpool_limits(limits=2, user_api='blas'):\n"
        "    if len(blas()) != 2:\n"
        "        raise SystemExit(5)  # a SciPy built on NumPy's own BLAS: nothing to show\n"
        "    with ops.single_threaded_blas():\n"
        "        assert blas() == [1, 1], blas()\n"
    )
    proc = patience.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cpu=60, check=False
    )
    if proc.returncode == 5:
        pytest.skip("this SciPy shares NumPy's BLAS: no second library to limit")
    assert proc.returncode == 0, proc.stderr
