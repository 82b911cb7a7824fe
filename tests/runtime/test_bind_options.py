"""The API takes the binding options the CLI takes, through one ``BindOptions``: a quantized
checkpoint bound with ``quant_output`` (swizzled, dequantized) and with unshared scales allowed
gives the API exactly the tensors ``bind --out`` writes with the same flags."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import patience
import pytest
from helpers import TABLE, TINY, copy_with, read_file

import specbind
from specbind import BindOptions
from specbind.core.errors import BindError, SpecbindError
from specbind.synth import synth

# every linear NVFP4, as in test_quant_claims
GEO = TINY | {
    "hidden": 128, "intermediate": 128, "moe_intermediate": 64, "v_head_dim": 32,
    "q_lora_rank": 48, "kv_lora_rank": 32,
}  # fmt: skip
SCHEME = next(s for s in TABLE.schemes if s.name == "nvfp4-modelopt")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("opts") / "ck"
    synth(TABLE, d, GEO, layers=2, seed=7, quant=SCHEME)
    return d


@pytest.fixture(scope="module")
def unshared(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint with layer 0's k_proj global scale doubled: q, k and v no longer share
    one, which the blocks require unless told otherwise."""
    name = "layers.0.self_attn.k_proj.weight_scale_2"
    src = next(f for f in sorted(ckpt.glob("*.safetensors")) if name in read_file(f))
    doubled = np.asarray(read_file(src)[name] * 2, dtype=np.float32)
    d = tmp_path_factory.mktemp("opts") / "unshared"
    copy_with(ckpt, d, {name: doubled})
    shutil.copy(ckpt / "hf_quant_config.json", d / "hf_quant_config.json")
    return d


def cli_out(ck: Path, out: Path, *flags: str) -> dict[str, np.ndarray]:
    proc = patience.run(
        [sys.executable, "-m", "specbind", "bind", str(ck), "--out", str(out), *flags],
        capture_output=True, text=True, cpu=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return read_file(out)


def same(api: dict[str, np.ndarray], cli: dict[str, np.ndarray]) -> None:
    assert api.keys() == cli.keys()
    for k, a in api.items():
        b = cli[k]
        assert a.shape == b.shape and a.dtype == b.dtype, k
        assert np.ascontiguousarray(a).tobytes() == b.tobytes(), k


@pytest.mark.parametrize("outputs", [["dequantized"], ["swizzled"], ["swizzled", "dequantized"]])
def test_the_api_binds_quantized_outputs_as_the_cli_writes_them(
    ckpt: Path, tmp_path: Path, outputs: list[str]
) -> None:
    flags = [x for o in outputs for x in ("--quant-output", o)]
    want = cli_out(ckpt, tmp_path / "r.safetensors", *flags)
    assert any(k.endswith("_bf16") for k in want) == ("dequantized" in outputs)
    assert any(k.endswith("_swizzled") for k in want) == ("swizzled" in outputs)
    ck = specbind.open(ckpt)
    keyword = outputs[0] if len(outputs) == 1 else outputs  # one name, or a list
    same(ck.bind(quant_output=keyword).tensors(), want)
    same(ck.bind(options=BindOptions(quant_output=tuple(outputs))).tensors(), want)


def test_the_api_allows_unshared_scales_as_the_cli_does(unshared: Path, tmp_path: Path) -> None:
    ck = specbind.open(unshared)
    with pytest.raises(BindError, match="allow"):
        ck.bind()
    want = cli_out(unshared, tmp_path / "r.safetensors", "--allow-unshared-scales")
    same(ck.bind(allow_unshared_scales=True).tensors(), want)
    same(ck.bind(options=BindOptions(allow_unshared_scales=True)).tensors(), want)


def test_options_and_the_same_keywords_at_once_are_refused(ckpt: Path) -> None:
    with pytest.raises(SpecbindError, match="give options= or the keyword"):
        specbind.open(ckpt).bind(options=BindOptions(), quant_output="dequantized")


def test_an_unknown_quantized_output_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(BindError, match=r"unknown quantized output\(s\) \['raw'\]"):
        BindOptions(quant_output=("raw",))
    assert BindOptions(quant_output="dequantized") == BindOptions(quant_output=["dequantized"])
