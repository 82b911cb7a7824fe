"""Quantized checkpoints through ``load_format="specbind"`` proven against vLLM's own loader:
real llm-compressor checkpoints (tests/support/vllm_quant_checkpoints.py) of each dense family
a served scheme layout's proof names (specs/engines/vllm/schemes/: FP8_DYNAMIC for 26 families,
W8A8, W4A16 and W4A16_ASYM at group 32 for Llama and Qwen3, at the vLLM proof rows' engine
geometries), built in process by
vLLM's ``get_model`` once with its default loader and once with specbind's, by the proofs'
workers (tests/vllm/proof_worker.py: one batch for every case selected here).

Claims, per checkpoint and tp (1, and both ranks of 2), for each scheme layout of
specs/engines/vllm/schemes/ that vLLM serves:
- every parameter as the loader left it, before vLLM's post-processing (the F8_E4M3 / I8
  weights with their F32 channel scales widened from the stored BF16; the int4 words, BF16
  group scales, zero-point words and a fused linear's last partner's weight_shape; the BF16
  rest) has the same name, shape, dtype and SHA-256 under both loaders, on each rank; at tp 2
  the ranks differ;
- every parameter and buffer after post-processing (vLLM's transposes and oneDNN repacking of
  what each loader wrote) is equal too;
- the compared parameters hold every quantized linear's packed weight and scale (a proof that
  compared no scale would prove nothing);
- per scheme layout that says vLLM cannot load it (``unavailable:``), vLLM's own loader still
  fails on a real checkpoint with the error line the layout quotes, and specbind's refuses;
- greedy tokens and top-5 logprobs of an engine started on the Qwen3 FP8_DYNAMIC, W8A8 and
  W4A16_ASYM checkpoints at tp 1 are equal under both loaders (tests/vllm/token_worker.py).
Results are cached by content (vllm_cache: the sources, and the checkpoint's own bytes).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest
import vllm_venv
import yaml

pytestmark = pytest.mark.interop

SCHEMES = vllm_venv.REPO / "specs" / "engines" / "vllm" / "schemes"
# each served scheme -> the writer's recipe part (tests/support/vllm_quant_checkpoints.py)
WRITERS = {
    "fp8-channel-compressed-tensors": ("fp8_dynamic",),
    "int8-channel-compressed-tensors": ("w8a8",),
    "int-group-compressed-tensors": ("w4a16_g32", "w4a16_asym_g32"),
}
# recipe part -> (packed weight's suffix and dtype, the scale's dtype, one scale per row)
PACKED = {
    "fp8_dynamic": ("weight", "torch.float8_e4m3fn", "torch.float32", True),
    "w8a8": ("weight", "torch.int8", "torch.float32", True),
    "w4a16_g32": ("weight_packed", "torch.int32", "torch.bfloat16", False),
    "w4a16_asym_g32": ("weight_packed", "torch.int32", "torch.bfloat16", False),
}


def _proven() -> tuple[str, ...]:
    """``<model>_<recipe part>`` for each model each served scheme layout's proof names."""
    out = []
    for p in sorted(SCHEMES.glob("*.yaml")):
        proof = yaml.safe_load(p.read_text()).get("proof")
        if proof is not None:
            out += [f"{m}_{w}" for m in proof["models"] for w in WRITERS[p.stem]]
    return tuple(out)


PROVEN = _proven()
CASES = [pytest.param(r, tp, id=f"{r}-tp{tp}") for r in PROVEN for tp in (1, 2)]
UNLOADABLE = {  # recipe -> its scheme
    "qwen3_fp8": "fp8-tensor-compressed-tensors",
    "qwen3_modelopt_fp8": "fp8-modelopt",
}
TOKENS = ("qwen3_fp8_dynamic", "qwen3_w8a8", "qwen3_w4a16_asym_g32")
KIND_TOKENS = "greedy tokens and top-5 logprobs at tp 1"

Results = dict[tuple[str, int], dict[str, Any]]


def _key(ckpt: Path, tp: int, kind: str) -> str:
    import vllm_cache
    import vllm_quant_checkpoints

    text = f"{vllm_cache.sources()}\n{vllm_quant_checkpoints.content(ckpt)}\ntp {tp}\n{kind}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _selected(items: list[pytest.Item]) -> set[tuple[str, int]]:
    """The (recipe, tp) the session's selected tests of this file read: ``-k gemma`` writes and
    proves Gemma's checkpoints alone."""
    want = set()
    for item in items:
        params = getattr(item, "callspec", None)
        if item.path == Path(__file__) and params is not None and "recipe" in params.params:
            want.add((params.params["recipe"], params.params.get("tp", 1)))
    return want


@pytest.fixture(scope="module")
def ckpts(request: pytest.FixtureRequest) -> dict[str, Path]:
    why = vllm_venv.why_missing()
    if why is not None:
        pytest.skip(why)
    if importlib.util.find_spec("llmcompressor") is None:  # imported by the writer alone
        pytest.skip("llm-compressor is not installed (it writes the checkpoints)")
    import vllm_quant_checkpoints

    return vllm_quant_checkpoints.written(sorted({r for r, _ in _selected(request.session.items)}))


@pytest.fixture(scope="module")
def proofs(
    request: pytest.FixtureRequest, ckpts: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Results:  # fmt: skip
    import vllm_cache
    import vllm_proofs

    jobs = sorted(_selected(request.session.items))
    keys = {j: _key(ckpts[j[0]], j[1], vllm_cache.RESULTS) for j in jobs}
    report = vllm_proofs.Report(what="vLLM quantized proofs")
    out: Results = {}
    for j, k in keys.items():
        hit = vllm_cache.load(k)
        if hit is not None:
            out[j] = hit
            report.cached.append(f"{j[0]} tp{j[1]}")
    todo = [j for j in jobs if j not in out]
    if todo:
        tmp = tmp_path_factory.mktemp("vllm-quant-proofs")
        ran = vllm_proofs.run_loads(todo, ckpts, tmp, report)
        for j in todo:
            vllm_cache.store(keys[j], ran[j])
            out[j] = ran[j]
            report.ran.append(f"{j[0]} tp{j[1]}")
    print(report.line())
    return out


def _ranks(load: dict[str, Any], what: str, kind: str) -> list[dict[str, tuple[Any, ...]]]:
    assert "error" not in load, f"{what}: {load['error']}"
    return [{n: (tuple(s), d, h) for n, s, d, h in rank} for rank in load[kind]]


def _same(result: dict[str, Any], kind: str, what: str, tp: int) -> list[dict[str, Any]]:
    theirs = _ranks(result["auto"], f"vLLM's own loader cannot load {what}", kind)
    ours = _ranks(result["specbind"], f"load_format='specbind' refused {what}", kind)
    assert len(ours) == len(theirs) == tp
    for rank in range(tp):
        only = sorted(ours[rank].keys() ^ theirs[rank].keys())
        assert not only, f"tp rank {rank}: {kind} named by one loader only: {only[:4]}"
        bad = [(n, ours[rank][n][:2], theirs[rank][n][:2]) for n in theirs[rank]
               if ours[rank][n] != theirs[rank][n]]  # fmt: skip
        assert not bad, f"tp rank {rank}: {len(bad)} {kind} differ, e.g. {bad[:3]}"
    if tp > 1 and kind != "buffers":
        assert ours[0] != ours[1], "the ranks hold the same share"
    return ours


@pytest.mark.parametrize(("recipe", "tp"), CASES)
def test_every_vllm_parameter_of_a_quantized_checkpoint_as_loaded_equals_the_default_loaders(
    proofs: Results, recipe: str, tp: int
) -> None:
    _same(proofs[(recipe, tp)], "loaded", f"{recipe} at tp {tp}", tp)


@pytest.mark.parametrize(("recipe", "tp"), CASES)
def test_every_vllm_parameter_and_buffer_of_a_quantized_checkpoint_after_post_processing_equals(
    proofs: Results, recipe: str, tp: int
) -> None:
    _same(proofs[(recipe, tp)], "ranks", f"{recipe} at tp {tp}", tp)
    _same(proofs[(recipe, tp)], "buffers", f"{recipe} at tp {tp}", tp)


@pytest.mark.parametrize(("recipe", "tp"), CASES)
def test_the_quantized_proofs_compare_each_linears_packed_weight_and_its_scale(
    proofs: Results, recipe: str, tp: int
) -> None:
    """Every linear vLLM holds in the scheme's packed form has its scale beside it (F32 per
    row, or BF16 per group), and every family's checkpoint holds some (the names are the
    family's own: qkv_proj, query_key_value, c_fc, ...)."""
    (rank0, *_) = _ranks(proofs[(recipe, tp)]["auto"], recipe, "loaded")
    suffix, code, scale, per_row = PACKED[recipe.partition("_")[2]]
    packed = {n.removesuffix(f".{suffix}") for n, (_, d, _) in rank0.items()
              if n.endswith(f".{suffix}") and d == code}  # fmt: skip
    scales = {n.removesuffix(".weight_scale"): v for n, v in rank0.items()
              if n.endswith(".weight_scale")}  # fmt: skip
    assert len(packed) >= 8 and packed == set(scales), sorted(packed ^ set(scales))[:4]
    for stem, (shape, dtype, _) in scales.items():
        assert dtype == scale and len(shape) == 2, (stem, shape, dtype)
        assert (shape[1] == 1) == per_row, (stem, shape)


@pytest.mark.parametrize("recipe", sorted(UNLOADABLE))
def test_a_scheme_vllm_cannot_load_is_refused_by_both_loaders_with_the_reason_quoted(
    proofs: Results, recipe: str
) -> None:
    result = proofs[(recipe, 1)]
    scheme = UNLOADABLE[recipe]
    path = vllm_venv.REPO / "specs" / "engines" / "vllm" / "schemes" / f"{scheme}.yaml"
    why = " ".join(yaml.safe_load(path.read_text())["unavailable"].split())
    err = result["auto"].get("error")
    assert err is not None, f"vLLM's own loader now loads {scheme}: give it a scheme layout"
    assert err in why, f"{path.name} quotes another error than vLLM's: {err!r}"
    ours = result["specbind"].get("error", "")
    assert ours.startswith("SpecbindError") or "BindError" in ours, ours
    assert scheme in ours and "cannot load" in ours, ours


def test_the_scheme_layouts_proof_is_this_file_at_tp_1_and_2_with_a_writer_per_scheme() -> None:
    """Each served scheme layout of vLLM names this file and tps 1 and 2, and the writer has a
    recipe for it; the cases are its proof's models (``_proven``)."""
    served = {}
    for p in sorted(SCHEMES.glob("*.yaml")):
        proof = yaml.safe_load(p.read_text()).get("proof")
        if proof is not None:
            served[p.stem] = proof
    assert set(served) == set(WRITERS)
    for name, proof in served.items():
        assert proof["test"] == "tests/vllm/test_vllm_quant_proofs.py", name
        assert set(proof["tp"]) == {1, 2}, name
        assert {"llama", "qwen3"} <= set(proof["models"]), name


@pytest.fixture(scope="module")
def tokens(
    request: pytest.FixtureRequest, ckpts: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Results:  # fmt: skip
    import vllm_cache
    import vllm_tokens
    import vllm_workers

    chosen = [r for r in TOKENS if (r, 1) in _selected(request.session.items)]
    keys = {r: _key(ckpts[r], 1, KIND_TOKENS) for r in chosen}
    out: Results = {}
    for r, k in keys.items():
        hit = vllm_cache.load(k)
        if hit is not None:
            out[(r, 1)] = hit
    todo = [r for r in chosen if (r, 1) not in out]
    if todo:
        tmp = tmp_path_factory.mktemp("vllm-quant-tokens")
        specs = []
        n = min(vllm_workers.WORKERS, len(todo))  # the workers' count, the loads dealt
        for i in range(n):
            spec = tmp / f"tokens{i}.json"
            loads = [{"key": r, "ckpt": str(ckpts[r])} for r in todo[i::n]]
            spec.write_text(json.dumps({"loads": loads}))
            specs.append(spec)
        results, _ = vllm_workers.run(vllm_tokens.WORKER, specs, "the vLLM quantized token runs")
        for r in todo:
            (held,) = [res[r] for res in results if r in res]
            vllm_cache.store(keys[r], held)
            out[(r, 1)] = held
    return out


@pytest.mark.parametrize("recipe", TOKENS)
def test_specbinds_engine_generates_the_default_loaders_tokens_from_a_quantized_checkpoint(
    tokens: Results, recipe: str
) -> None:
    result = tokens[(recipe, 1)]
    theirs, ours = result["auto"], result["specbind"]
    assert "error" not in theirs, f"vLLM's own loader's engine cannot run {recipe}: {theirs}"
    assert "error" not in ours, f"load_format='specbind' on {recipe}: {ours['error']}"
    lps = [float(lp) for step in theirs["logprobs"] for _, lp in step]
    assert lps and all(math.isfinite(x) for x in lps), f"vLLM's own loader gives {lps[:5]}"
    assert ours["tokens"] == theirs["tokens"]
    assert ours["logprobs"] == theirs["logprobs"]
