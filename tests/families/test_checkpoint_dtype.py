"""The checkpoint's own half dtype (runtime/layout/config.py choose, runtime/binder/checks.py rules_in): a family stored in F16 throughout binds
as F16 where its model spec allows it (``dtypes: [BF16, F16]``: Llama and the families built
from it), and nothing is converted between F16 and BF16.

Claims:
* an F16 Llama checkpoint written by transformers (config.json ``dtype: float16``) binds at
  tp 1 and on every rank of tp 2 (KV heads replicated at tp 4 too); every field is F16 (the
  array and its rule), and equals vLLM's slice of the module loaded from it (float64: F16
  widens exactly), for every field of every layer;
* a mixed checkpoint (one BF16 tensor in an F16 file) is refused in one line naming the tensor
  and why;
* a model whose spec lists no F16 refuses an F16 config.json in one line, before any byte; and
  ``dtype="F16"`` asked of a BF16 checkpoint is refused at its first tensor (never rounded);
* a spec that allows F16 for a block computing a field by a transform is refused at generate.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from family_layouts import LLAMA_LAYER, LM_GLOBALS

from specbind.core.errors import BindError, SpecError
from specbind.generated import MODELS
from specbind.generator.render import load_specs
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)

pytestmark = pytest.mark.interop

REPO = Path(__file__).resolve().parents[2]
CONFIG: dict[str, Any] = {
    "vocab_size": 112,
    "hidden_size": 40,
    "intermediate_size": 72,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 12,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
}


def _write(path: Path, bf16: str | None = None) -> Path:
    """A Llama written by transformers in F16 throughout (``bf16``: one parameter in BF16)."""
    gen = torch.Generator().manual_seed(5)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG, dtype="float16"))
    with torch.no_grad():
        for name, t in model.named_parameters():
            v = torch.randn(t.shape, generator=gen) * 0.05
            t.data = v.to(torch.bfloat16 if name == bf16 else torch.float16)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def f16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("f16") / "ck")


def test_an_f16_llama_binds_as_f16_and_every_field_is_the_modules_slice(f16: Path) -> None:
    assert json.loads((f16 / "config.json").read_text())["dtype"] == "float16"
    module = transformers.LlamaForCausalLM.from_pretrained(f16, dtype=torch.float64).eval()
    cfg = json.loads((f16 / "config.json").read_text())
    checked = 0
    for tp in (1, 2, 4):
        for r in range(tp):
            bound = bind_checkpoint(CheckpointDir(f16), MODELS["llama"], tp_size=tp, tp_rank=r,
                                    progress=False).fields()  # fmt: skip
            for key, (rule, arr) in bound.items():
                assert rule.dtype == "F16" and arr.dtype == np.float16, (key, rule.dtype)
                if key.startswith("globals."):
                    ref, root = LM_GLOBALS[key.removeprefix("globals.")], module
                else:
                    _, i, slot, field = key.split(".")
                    ref, root = LLAMA_LAYER[f"{slot}.{field}"], module.model.layers[int(i)]
                want = ref.slice(lambda n, m=root: m.get_parameter(n).detach().numpy(), cfg, tp, r)
                assert np.array_equal(arr.astype(np.float64), want), (key, tp, r)
                checked += 1
    assert checked == (2 * len(LLAMA_LAYER) + len(LM_GLOBALS)) * (1 + 2 + 4)


def test_a_mixed_checkpoint_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    ck = _write(tmp_path / "mixed", bf16="model.layers.1.mlp.down_proj.weight")
    with pytest.raises(BindError) as e:
        bind_checkpoint(CheckpointDir(ck), MODELS["llama"], progress=False)
    msg = str(e.value)
    assert (
        "layer 1: model.layers.1.mlp.down_proj.weight is BF16 but a dense block requires F16" in msg
    )
    assert "mixed checkpoint is refused" in msg and "\n" not in msg


def test_f16_where_the_spec_lists_only_bf16_is_refused_before_any_byte(tmp_path: Path) -> None:
    from specbind.synth import synth, tiny_values

    table = MODELS["qwen3-moe"]
    synth(table, tmp_path / "ck", tiny_values(table), layers=2)
    cfg_path = tmp_path / "ck" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = "float16"
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(BindError) as e:
        bind_checkpoint(CheckpointDir(tmp_path / "ck"), table, progress=False)
    msg = str(e.value)
    assert "model qwen3-moe binds BF16 checkpoints, but config.json torch_dtype float16" in msg
    assert "\n" not in msg


def test_f16_asked_of_a_bf16_checkpoint_is_refused_at_its_first_tensor(tmp_path: Path) -> None:
    from specbind.synth import synth, tiny_values

    table = MODELS["llama"]
    synth(table, tmp_path / "ck", tiny_values(table), layers=2)
    with pytest.raises(BindError) as e:
        bind_checkpoint(CheckpointDir(tmp_path / "ck"), table, progress=False, dtype="F16")
    assert "is BF16 but a" in str(e.value) and "requires F16" in str(e.value)


def test_f16_for_a_block_with_a_transform_is_refused_at_generate(tmp_path: Path) -> None:
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    p = tmp_path / "specs" / "models" / "deepseek-v3.yaml"
    p.write_text(p.read_text().replace("model_types: [deepseek_v3]\n",
                                       "model_types: [deepseek_v3]\ndtypes: [BF16, F16]\n"))  # fmt: skip
    with pytest.raises(SpecError) as e:
        load_specs(tmp_path)
    assert e.value.path == "dtypes" and "by a transform" in e.value.message
