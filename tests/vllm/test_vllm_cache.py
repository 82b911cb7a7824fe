"""The vLLM proofs' content cache (tests/support/vllm_cache.py): what its key holds, and that a
result read from it is run again by nothing and said to come from it. No vLLM needed."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import vllm_cache
import vllm_proofs
from vllm_rows import BY_MODEL

ROW = BY_MODEL["llama"]


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECBIND_VLLM_PROOFS_FRESH", raising=False)
    return tmp_path / "cache"


def test_the_key_tells_the_tps_and_the_rows_geometry_apart() -> None:
    keys = {
        vllm_cache.key(ROW, 1),
        vllm_cache.key(ROW, 2),
        vllm_cache.key(dataclasses.replace(ROW, config=ROW.config | {"vocab_size": 201}), 1),
        vllm_cache.key(BY_MODEL["qwen3-moe"], 1),
    }
    assert len(keys) == 4
    # the tps a session selects are not part of it: one tp's result serves every selection
    assert vllm_cache.key(dataclasses.replace(ROW, tps=(2,)), 2) == vllm_cache.key(ROW, 2)


def test_the_sources_digest_changes_with_a_spec_a_generated_file_or_a_new_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    for tree in ("specs", "generated", "tests/vllm"):
        shutil.copytree(vllm_cache.REPO / tree, repo / tree)
    for f in vllm_cache._FILES:
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(vllm_cache.REPO / f, repo / f)
    monkeypatch.setattr(vllm_cache, "REPO", repo)

    def digest() -> str:
        vllm_cache.sources.cache_clear()
        return vllm_cache.sources()

    before = digest()
    layout = repo / "specs" / "engines" / "vllm" / "llama.yaml"
    layout.write_text(layout.read_text() + "# a comment\n")
    edited = digest()
    (repo / "generated" / "engines" / "extra.py").write_text("")
    added = digest()
    vllm_cache.sources.cache_clear()
    assert len({before, edited, added}) == 3


def test_a_stored_result_is_read_back_and_fresh_ignores_it(
    cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = {"auto": {"error": "E: x"}, "specbind": {"error": "E: x"}}
    vllm_cache.store("k" * 32, result)
    assert vllm_cache.load("k" * 32) == result
    assert vllm_cache.load("j" * 32) is None
    (vllm_cache.folder() / f"{'t' * 32}.json").write_text('{"torn')
    assert vllm_cache.load("t" * 32) is None  # a torn write is run again
    monkeypatch.setenv("SPECBIND_VLLM_PROOFS_FRESH", "1")
    assert vllm_cache.load("k" * 32) is None


def test_every_result_in_the_cache_runs_no_worker_and_the_report_says_so(
    cache_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = {"auto": {"ranks": [[]]}, "specbind": {"ranks": [[]]}}
    for tp in ROW.tps:
        vllm_cache.store(vllm_cache.key(ROW, tp), done)

    def no_worker(*args: object) -> None:
        raise AssertionError("a worker ran though every result was cached")

    monkeypatch.setattr(vllm_proofs, "_run", no_worker)
    results, report = vllm_proofs.prove((ROW,), tmp_path / "work")
    assert results == {("llama", tp): done for tp in ROW.tps}
    assert report.ran == [] and report.cached == ["llama tp1", "llama tp2"]
    assert report.line().startswith("vLLM parameter proofs: 2 from the cache ")
    assert "llama tp1, llama tp2" in report.line()


def test_a_result_stored_before_buffers_were_recorded_is_not_read_back(cache_home: Path) -> None:
    """The key names the kind of result: one stored under the key of a result without
    buffers (the same sources, row and tp) is never read as a proof result."""
    import hashlib

    text = f"{vllm_cache.sources()}\n{ROW.key()}\ntp 1"
    before = hashlib.sha256(text.encode()).hexdigest()[:32]  # the key form without buffers
    vllm_cache.store(before, {"auto": {"ranks": [[]]}, "specbind": {"ranks": [[]]}})
    assert vllm_cache.key(ROW, 1) != before
    assert vllm_cache.load(vllm_cache.key(ROW, 1)) is None
    assert vllm_cache.key(ROW, 1, "tokens") != vllm_cache.key(ROW, 1)
