"""Write tiny quantized GLM-5.3-Flash checkpoints with the real tools, on CPU.

    python tests/support/quant_writers.py RECIPE OUT

Recipes: ModelOpt 0.47 (``mo_nvfp4`` NVFP4_DEFAULT_CFG, ``mo_nvfp4_experts``
NVFP4_EXPERTS_ONLY_CFG, ``mo_w4a16`` W4A16_NVFP4_CFG, ``mo_fp8`` FP8_DEFAULT_CFG; calibrated,
exported with ``export_hf_checkpoint``, which writes transformers' internal names) and
llmcompressor 0.14 (``llmc_nvfp4`` NVFP4, ``llmc_nvfp4a16`` NVFP4A16, ``llmc_fp8_block``
FP8_BLOCK, ``llmc_fp8_dynamic`` FP8_DYNAMIC, ``llmc_fp8`` FP8 with static inputs,
``llmc_w8a8`` W8A8 int8; saved with ``save_compressed=True``, hub names; the FP8 and int8
ones also write compressed-tensors' own decompression of every quantized linear beside them,
``reference/decompressed.safetensors``). Run in a subprocess by ``tests/quant/test_quant_real.py``: the
tools import torch and patch transformers, which must not leak into the test process.

The geometry satisfies specbind's block constraints at tp 1, 2 and 4 (KDA 8 heads of 64, DSA
4 heads) and NVFP4's at every one of them: every linear's input width, and every column shard
of it at tp 4, is a multiple of 16. The DSA layers follow each other (a shared-indexer layer
needs the previous layer's top-k in transformers' forward, which calibration runs).
Traps (ground truth from running the tools): ModelOpt must be told to leave the fused
``self_attn.conv1d`` alone, or its config claims the conv is NVFP4; llmcompressor re-reads
``config.json`` from ``name_or_path`` and wants a processor when given a dataset.
"""

from __future__ import annotations

import copy
import re
import sys
import warnings
from pathlib import Path
from typing import Any

TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 192,
    "moe_intermediate_size": 64,
    "n_routed_experts": 6,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "vocab_size": 160,
    "hc_mult": 2,
    "num_hidden_layers": 5,
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse", "sparse"],
    "layer_types": [
        "linear_attention",
        "linear_attention",
        "indexed_attention",
        "indexed_attention",
        "linear_attention",
    ],
    "index_topk_pattern": "FFFSF",
    "linear_num_heads": 8,
    "linear_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 64,
    "kv_lora_rank": 96,
    "qk_nope_head_dim": 16,
    "v_head_dim": 32,
    "qk_rope_head_dim": 0,
    "index_n_heads": 4,
    "index_head_dim": 16,
    "index_kpool": 4,
    "index_topk": 8,
    "pad_token_id": 0,
}
VISION_CONFIG: dict[str, Any] = {
    "depth": 1,
    "hidden_size": 32,
    "num_heads": 2,
    "intermediate_size": 64,
    "out_hidden_size": 128,
    "projection_intermediate_size": 64,
}
F32_IN_MODULE = re.compile(
    r".*\.(forget_gate\.(A_log|dt_bias)|gate\.e_score_correction_bias|(attn|ffn)_hc\.(base|scale))"
)


def build_model(seed: int = 0) -> Any:
    import torch
    import transformers

    config = transformers.Glm5NextConfig(
        text_config=dict(TEXT_CONFIG), vision_config=dict(VISION_CONFIG)
    )
    torch.manual_seed(seed)
    model = transformers.Glm5NextForConditionalGeneration(config)
    model.config.architectures = ["Glm5NextForConditionalGeneration"]  # ModelOpt export reads it
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        tensors = [*model.named_parameters()]
        tensors += [(n, b) for n, b in model.named_buffers() if n.endswith("correction_bias")]
        for name, t in tensors:
            v = t.detach().float()
            if name.endswith("e_score_correction_bias"):
                v = torch.randn(v.shape, generator=gen) * 0.02
            elif v.numel() > 0 and bool((v == v.reshape(-1)[0]).all()):
                v = v + (torch.rand(v.shape, generator=gen) - 0.5)  # no constant tensors
            t.data = v if F32_IN_MODULE.fullmatch(name) else v.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16  # llmcompressor builds its experts in config.dtype
    model.config.text_config.dtype = torch.bfloat16
    return model.eval()


def calib_ids(n: int = 2, t: int = 8) -> Any:
    import torch

    g = torch.Generator().manual_seed(123)
    return torch.randint(1, TEXT_CONFIG["vocab_size"], (n, t), generator=g)


def modelopt(out: Path, cfg_name: str) -> None:
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint

    model = build_model()
    cfg = copy.deepcopy(getattr(mtq, cfg_name))
    cfg["quant_cfg"].append({"quantizer_name": "*self_attn.conv1d*", "enable": False})
    ids = calib_ids()

    def forward_loop(m: Any) -> None:
        with torch.no_grad():
            for row in ids:
                m(input_ids=row[None])

    mtq.quantize(model, cfg, forward_loop=forward_loop)
    export_hf_checkpoint(model, export_dir=str(out))


def tokenizer(size: int = TEXT_CONFIG["vocab_size"]) -> Any:
    """A word-level tokenizer over ``size`` tokens ``t0``..: what llmcompressor asks for when
    it is given a calibration dataset."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t1"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", unk_token="t1")


def int_groups(bits: int, symmetric: bool) -> dict[str, Any]:
    """llmcompressor's W4A16 / W4A16_ASYM presets at group 32 (their 128 does not divide this
    model's widths): one config group of ``bits``-bit integer weights, no input quantization."""
    weights = {"num_bits": bits, "type": "int", "strategy": "group", "group_size": 32,
               "symmetric": symmetric, "dynamic": False}  # fmt: skip
    return {"group_0": {"targets": ["Linear"], "weights": weights}}


def llmc(out: Path, scheme: str, calib: bool, gptq: str | None = None) -> None:
    import datasets
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    model = build_model()
    base = out.parent / f".{out.name}.base"
    model.save_pretrained(str(base))  # oneshot re-reads config.json from name_or_path
    model.config.name_or_path = str(base)
    ignore = ["lm_head", "re:.*visual.*", "re:.*mlp\\.gate$"]
    kw: dict[str, Any] = {"ignore": ignore}
    if scheme in GROUPS:
        kw["config_groups"] = GROUPS[scheme]
    else:
        kw |= {"scheme": scheme, "targets": ["Linear"]}
    if gptq is not None:
        from llmcompressor.modifiers.quantization import GPTQModifier

        recipe: Any = GPTQModifier(actorder=gptq, **kw)
    else:
        recipe = QuantizationModifier(**kw)
    if calib:
        ids = calib_ids()
        ds = datasets.Dataset.from_dict(
            {"input_ids": ids.tolist(), "attention_mask": [[1] * ids.shape[1]] * ids.shape[0]}
        )
        oneshot(
            model=model, recipe=recipe, dataset=ds, processor=tokenizer(),
            num_calibration_samples=len(ids), max_seq_length=ids.shape[1],
        )  # fmt: skip
    else:
        oneshot(model=model, recipe=recipe)
    model.save_pretrained(str(out), save_compressed=True)
    if scheme in REFERENCE:
        reference(out)


# The schemes whose every quantized linear is also written decompressed by compressed-tensors
# itself (``reference/decompressed.safetensors``: the module name -> its BF16 [O, I]), the
# ground truth of specbind's dequantization.
REFERENCE = ("FP8_DYNAMIC", "FP8", "W8A8", "W4A16_G32", "W4A16_ASYM_G32")
GROUPS = {"W4A16_G32": int_groups(4, True), "W4A16_ASYM_G32": int_groups(4, False)}


def reference(out: Path) -> None:
    import json

    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors import safe_open
    from safetensors.torch import save_file

    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    (group,) = qc["config_groups"].values()
    scheme = QuantizationScheme(**{k: v for k, v in group.items() if k != "format"})
    compressor = BaseCompressor.get_value_from_registry(group.get("format", qc["format"]))
    done = {}
    for shard in sorted(out.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            keys = set(f.keys())
            for k in sorted(keys):
                if not k.endswith(".weight_scale"):
                    continue
                pre = k.removesuffix("weight_scale")
                sd = {n[len(pre) :]: f.get_tensor(n) for n in keys if n.startswith(pre)}
                if "weight_zero_point" in sd and sd["weight_zero_point"].shape[0] == 1:
                    # compressed-tensors 0.20 cannot unpack a zero point of one word row
                    # (O <= 8: [1, G] transposed is not byte-viewable): no reference for it
                    continue
                done[pre.removesuffix(".")] = compressor.decompress(sd, scheme)["weight"]
    (out / "reference").mkdir()
    save_file(done, str(out / "reference" / "decompressed.safetensors"))


RECIPES = {
    "mo_nvfp4": lambda o: modelopt(o, "NVFP4_DEFAULT_CFG"),
    "mo_nvfp4_experts": lambda o: modelopt(o, "NVFP4_EXPERTS_ONLY_CFG"),
    "mo_w4a16": lambda o: modelopt(o, "W4A16_NVFP4_CFG"),
    "llmc_nvfp4": lambda o: llmc(o, "NVFP4", calib=True),
    "llmc_nvfp4a16": lambda o: llmc(o, "NVFP4A16", calib=False),
    "llmc_fp8_block": lambda o: llmc(o, "FP8_BLOCK", calib=False),
    "llmc_fp8_dynamic": lambda o: llmc(o, "FP8_DYNAMIC", calib=False),
    "llmc_fp8": lambda o: llmc(o, "FP8", calib=True),
    "llmc_w8a8": lambda o: llmc(o, "W8A8", calib=False),
    "mo_fp8": lambda o: modelopt(o, "FP8_DEFAULT_CFG"),
    "llmc_w4a16": lambda o: llmc(o, "W4A16_G32", calib=False),
    "llmc_w4a16_asym": lambda o: llmc(o, "W4A16_ASYM_G32", calib=False),
    "llmc_gptq_w4a16": lambda o: llmc(o, "W4A16_G32", calib=True, gptq="weight"),
}

if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    RECIPES[sys.argv[1]](Path(sys.argv[2]))
