"""An F16 checkpoint bound with ``--out`` reads back (``bind --from``, ``open_bound``) as F16.

The bind writes the spec's BF16 fields in the checkpoint's own half dtype
(``runtime.layout.config.choose``); the reload reads that half from the file and checks every
field against it: each reloaded field is the F16 array the bind returned, on every rank of
tp 2. A file holding both halves, or F16 for a model whose spec binds BF16 only, is refused in
one line naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specbind.api import open_bound
from specbind.cli import main
from specbind.core.errors import ReloadError
from specbind.generated import MODELS, SPECS_SHA256
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.bound.reload import read_bound
from specbind.runtime.io.checkpoint import CheckpointDir

torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)

CONFIG: dict[str, Any] = {
    "vocab_size": 112, "hidden_size": 40, "intermediate_size": 72, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 12,
    "tie_word_embeddings": False, "pad_token_id": 0,
}  # fmt: skip


@pytest.fixture(scope="module")
def f16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama written by transformers in F16 throughout (config.json ``dtype: float16``)."""
    path = tmp_path_factory.mktemp("f16") / "ck"
    gen = torch.Generator().manual_seed(11)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG, dtype="float16"))
    with torch.no_grad():
        for _, t in model.named_parameters():
            t.data = (torch.randn(t.shape, generator=gen) * 0.05).to(torch.float16)
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("rank", [0, 1])
def test_an_f16_rank_bound_with_out_reloads_as_the_f16_fields_its_bind_returned(
    f16: Path, tmp_path: Path, rank: int, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / f"r{rank}.safetensors"
    args = ["bind", str(f16), "--tp-size", "2", "--tp-rank", str(rank), "--out", str(out)]
    assert main(args) == 0
    capsys.readouterr()
    bound = bind_checkpoint(
        CheckpointDir(f16), MODELS["llama"], tp_size=2, tp_rank=rank, progress=False
    ).fields()
    for copy in (False, True):
        back = open_bound(out, tp_size=2, tp_rank=rank, copy=copy)
        assert set(back.tensors) == set(bound)
        for name, (_, arr) in bound.items():
            got = back.tensors[name]
            assert got.dtype == np.float16 == np.asarray(arr).dtype, name
            assert np.array_equal(np.asarray(got), np.asarray(arr)), name
    assert main(["bind", "--from", str(out), "--tp-rank", str(rank), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["tp_rank"] == rank and rep["model"] == "llama"


def _bound_f16(f16: Path, tmp_path: Path, model: str) -> Path:
    out = tmp_path / "r.safetensors"
    assert main(["bind", str(f16), "--model", model, "--out", str(out)]) == 0
    return out


def test_an_f16_file_of_a_model_that_binds_bf16_only_is_refused_naming_the_half(
    f16: Path, tmp_path: Path
) -> None:
    out = _bound_f16(f16, tmp_path, "llama")
    # the same file checked against a llama table whose spec lists BF16 only
    import dataclasses

    bf16_only = dataclasses.replace(MODELS["llama"], dtypes=("BF16",))
    models = {"llama": bf16_only}
    with pytest.raises(ReloadError) as e:
        read_bound(out, models=models, specs_sha256=SPECS_SHA256)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(out))
    assert "its tensors are F16, but model llama binds BF16 only" in msg
