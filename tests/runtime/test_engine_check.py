"""``specbind.engine_check.check_before_build``: what the vLLM loader checks at the top of its
``load_model``, before vLLM builds the model: the census and dtypes (and config), in one line
naming the stored tensor, without reading any tensor's bytes; a checkpoint it passes binds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_params import tiny_llama
from helpers import copy_with, read_file

from specbind.core.errors import BindError
from specbind.engine import bind_for_engine
from specbind.engine_check import check_before_build

Q = "layers.1.self_attn.q_proj.weight"  # as the synth Llama stores it


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory, "check")


@pytest.fixture
def unread(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every read of a tensor's bytes through specbind's reader, and every hash of a tensor
    (the audit's search for identical bytes reads each tensor it hashes), is recorded."""
    import hashlib
    import types

    from specbind import audit
    from specbind.runtime.io import safetensors_file

    reads: list[str] = []

    def blake2b(*a: Any, **k: Any) -> Any:
        reads.append("hash")
        return hashlib.blake2b(*a, **k)

    monkeypatch.setattr(
        audit, "hashlib", types.SimpleNamespace(blake2b=blake2b, sha256=hashlib.sha256)
    )
    for name in ("read_view", "private_view"):
        real = getattr(safetensors_file, name)

        def counted(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            reads.append(_name)
            return _real(*a, **k)

        monkeypatch.setattr(safetensors_file, name, counted)
    return reads


def test_a_checkpoint_missing_a_tensor_is_refused_before_the_engine_builds_its_model(
    llama: Path, tmp_path: Path, unread: list[str]
) -> None:
    bad = copy_with(llama, tmp_path / "missing", {Q: None})
    with pytest.raises(BindError) as e:
        check_before_build(bad, "vllm")
    line = str(e.value)
    assert "\n" not in line and "self_attn.q_proj.weight" in line and "missing" in line, line
    assert unread == []


def test_a_tensor_cast_to_f32_is_refused_before_the_engine_builds_its_model(
    llama: Path, tmp_path: Path, unread: list[str]
) -> None:
    (q,) = [a for f in llama.glob("*.safetensors") for n, a in read_file(f).items() if n == Q]
    bad = copy_with(llama, tmp_path / "cast", {Q: np.zeros(q.shape, np.float32)})
    with pytest.raises(BindError) as e:
        check_before_build(bad, "vllm")
    assert "self_attn.q_proj.weight" in str(e.value) and "F32" in str(e.value), str(e.value)
    assert unread == []


def test_a_checkpoint_the_check_passes_binds_for_the_engine_and_no_tensor_was_read(
    llama: Path, unread: list[str]
) -> None:
    check_before_build(llama, "vllm")  # layers of equal sizes: nothing hashed either
    assert unread == []
    assert bind_for_engine(llama, "vllm")
