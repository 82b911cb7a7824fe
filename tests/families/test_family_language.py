"""The language extensions a second and third model family needed, each refused or accepted
on its own (the families' own tests are test_family_*.py):

* ``stored_singletons``: a tensor stored with extra size-1 axes binds as its declared shape
  (the same row-major bytes) and shards on it; any other shape is still refused;
* a name-map rule with a member placeholder renames one name member by member; a placeholder
  on one side only, or on a prefix, is refused at generate time;
* a unary output's ``reshape`` after its slice: it merges consecutive axes only;
* ``model_types`` / ``default`` pick the model when ``--model`` is not given: by the
  checkpoint's config.json, else (no checkpoint) the one default; two defaults are refused;
* ``synth`` and ``bench`` run for a model other than the default from its spec alone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specbind.core.errors import BindError, SpecError
from specbind.core.ir import ShardRule, TensorRule
from specbind.core.planning import plan_tensor
from specbind.generator.render import load_specs
from specbind.runtime.binder.tp import shard_raw
from specbind.runtime.io.source import RawTensor

REPO = Path(__file__).resolve().parents[2]
KIMI = "models/kimi-linear.yaml"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    return tmp_path


def edit(root: Path, rel: str, old: str, new: str) -> None:
    p = root / "specs" / rel
    text = p.read_text()
    assert old in text, old
    p.write_text(text.replace(old, new, 1))


def _rule(singletons: bool) -> TensorRule:
    return TensorRule("a", "F32", "[H]", ShardRule("rows", "H", 0), stored_singletons=singletons)


def _raw(shape: tuple[int, ...]) -> RawTensor:
    data = np.arange(8, dtype=np.float32)
    return RawTensor("F32", shape, memoryview(data.tobytes()))


def test_extra_size_one_axes_bind_as_the_declared_shape_and_shard_on_it() -> None:
    plan = plan_tensor("b", _rule(True), (8,), {"H": 8, "tp": 2}, 2, 1)
    got = shard_raw(plan, _raw((1, 1, 8, 1)), 0)
    assert got.shape == (4,)
    assert np.frombuffer(got.data, dtype=np.float32).tolist() == [4.0, 5.0, 6.0, 7.0]


def test_a_stored_shape_that_is_not_the_declared_one_plus_size_one_axes_is_refused() -> None:
    plan = plan_tensor("b", _rule(True), (8,), {"H": 8, "tp": 2}, 2, 0)
    with pytest.raises(BindError, match=r"has shape \[2, 4\], expected \[8\]"):
        shard_raw(plan, _raw((2, 4)), 0)
    strict = plan_tensor("b", _rule(False), (8,), {"H": 8, "tp": 2}, 2, 0)
    with pytest.raises(BindError, match=r"has shape \[1, 8\], expected \[8\]"):
        shard_raw(strict, _raw((1, 8)), 0)


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        (
            'to: "mlp.experts.{e}.gate_proj.weight"',
            'to: "mlp.experts.0.gate_proj.weight"',
            "placeholder ({e}) appears once in `from` and once in `to`",
        ),
        (
            'from: "block_sparse_moe.experts.{e}.w1.weight"',
            'from: "block_sparse_moe.experts.{e}."',
            "a whole name, not a prefix",
        ),
    ],
    ids=["one-side", "prefix"],
)
def test_a_bad_member_rename_is_refused_naming_the_rule(
    root: Path, old: str, new: str, fragment: str
) -> None:
    edit(root, KIMI, old, new)
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.file == f"specs/{KIMI}" and e.value.path == "names[0]"
    assert fragment in e.value.message and "\n" not in str(e.value)


def test_a_reshape_that_does_not_merge_consecutive_axes_is_refused(root: Path) -> None:
    """[heads, rope, hidden] read as [heads * rope, hidden] is fine; as [heads * hidden, rope]
    it would interleave heads."""
    edit(root, "blocks/mla.yaml", "reshape: [heads * qk_rope_head_dim, hidden]",
         "reshape: [heads * hidden, qk_rope_head_dim]")  # fmt: skip
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.path == "outputs.q_rope.reshape"
    assert "does not merge consecutive axes" in e.value.message


def test_two_default_models_are_refused(root: Path) -> None:
    edit(root, KIMI, "model_types: [kimi_linear]\n", "model_types: [kimi_linear]\ndefault: true\n")
    with pytest.raises(SpecError, match="is the default already"):
        load_specs(root)


def test_a_model_type_claimed_twice_is_refused(root: Path) -> None:
    edit(root, KIMI, "model_types: [kimi_linear]", "model_types: [glm5_next]")
    with pytest.raises(SpecError, match="'glm5_next' is also claimed by"):
        load_specs(root)


def test_synth_audit_and_bind_pick_the_model_without_being_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """synth --model writes a Kimi checkpoint; audit and bind find Kimi from its config.json;
    synth without --model writes the default model."""
    from specbind.cli import main

    assert main(["synth", "--model", "kimi-linear", str(tmp_path / "k")]) == 0
    assert json.loads((tmp_path / "k" / "config.json").read_text())["model_type"] == "kimi_linear"
    capsys.readouterr()
    assert main(["audit", "--json", str(tmp_path / "k")]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["model"] == "kimi-linear" and rep["coverage"]["unaccounted"] == 0
    assert rep["problems"] == []
    ranks = ["--tp-size", "2", "--tp-rank", "1", "--ep-size", "3", "--ep-rank", "2"]
    assert main(["bind", *ranks, str(tmp_path / "k")]) == 0
    assert main(["synth", str(tmp_path / "g")]) == 0
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    assert config["model_type"] != "kimi_linear"


def test_bench_runs_for_a_model_other_than_the_default(tmp_path: Path) -> None:
    """The hand-written baseline's outputs agree with the bound fields (else bench refuses),
    and the absorb rows come from the model's own contracting block (mla), at tp 1 and 2.
    The rows that do not depend on the model (whole processes, fixed cost, generate) are
    tests/tools/test_bench_smoke.py's; here only the model-specific ones run."""
    from benchmarks import main as bench
    from specbind.generated import MODELS
    from specbind.runtime.io.checkpoint import CheckpointDir
    from specbind.runtime.layout.config import values_from_config

    table = MODELS["kimi-linear"]
    ckpt, _ = bench.ensure_checkpoint(table, tmp_path, tiny=True)
    rows = [bench.measure(ckpt, table, part, tp, 1, 1) for part in ("attention", "experts")
            for tp in (1, 2)]  # fmt: skip
    assert [(r["part"], r["tp"]) for r in rows] == [
        ("attention", 1), ("attention", 2), ("experts", 1), ("experts", 2)
    ]  # fmt: skip
    values = values_from_config(table, CheckpointDir(ckpt).config)
    absorb = bench.absorb_rows(table, values, [1, 2], 1)
    assert [(a["geometry"]["block"], a["geometry"]["tp"]) for a in absorb] == [
        ("mla", 1),
        ("mla", 2),
    ]
    assert all(a["gflop"] > 0 and a["matmul_gflops"] > 0 for a in absorb)


def test_a_model_constraint_that_fails_at_its_own_geometry_is_refused_at_generate(
    root: Path,
) -> None:
    glm = "models/glm-5.3-flash.yaml"
    edit(root, glm, "{config: qk_rope_head_dim,       value: 0, min: 0}",
         "{config: qk_rope_head_dim,       value: 64, min: 0}")  # fmt: skip
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.path == "constraints[0].check"
    assert "constraint nope_only fails" in e.value.message


def test_a_model_constraint_over_an_unknown_symbol_is_refused(root: Path) -> None:
    edit(root, "models/glm-5.3-flash.yaml", "check: qk_rope_head_dim == 0", "check: rope == 0")
    with pytest.raises(SpecError, match=r"unknown symbol\(s\) rope"):
        load_specs(root)


def _kimi_config() -> dict[str, object]:
    """config.json as transformers writes it for the Kimi synth geometry: flat linear_* fields."""
    from specbind.generated import MODELS
    from specbind.synth import tiny_values

    table = MODELS["kimi-linear"]
    values = tiny_values(table)
    return {f.config: values[f.name] for f in table.geometry_fields if f.config is not None}


def test_a_geometry_field_is_read_from_its_nested_path_when_the_flat_one_is_absent() -> None:
    """The hub's Kimi config.json has the KDA sizes only in linear_attn_config."""
    from specbind.generated import MODELS
    from specbind.runtime.layout.config import values_from_config

    table = MODELS["kimi-linear"]
    flat = _kimi_config()
    hub = {k: v for k, v in flat.items() if not k.startswith("linear_")}
    hub["linear_attn_config"] = {
        "num_heads": flat["linear_num_heads"], "head_dim": flat["linear_head_dim"],
        "short_conv_kernel_size": flat["linear_conv_kernel_dim"], "kda_layers": [1, 2, 4],
    }  # fmt: skip
    assert values_from_config(table, hub) == values_from_config(table, flat)
    both = flat | {"linear_attn_config": hub["linear_attn_config"]}
    assert values_from_config(table, both) == values_from_config(table, flat)


def test_a_nested_path_that_disagrees_with_the_flat_field_is_refused() -> None:
    from specbind.core.errors import CheckpointError
    from specbind.generated import MODELS
    from specbind.runtime.layout.config import values_from_config

    flat = _kimi_config()
    both = flat | {"linear_attn_config": {"num_heads": int(str(flat["linear_num_heads"])) * 2}}
    with pytest.raises(CheckpointError) as e:
        values_from_config(MODELS["kimi-linear"], both)
    assert str(e.value) == (
        f"config.json: linear_num_heads is {flat['linear_num_heads']} but "
        f"linear_attn_config.num_heads is {int(str(flat['linear_num_heads'])) * 2}; "
        "both are geometry symbol linear_heads"
    )
    with pytest.raises(CheckpointError, match="missing field 'linear_num_heads' or "):
        values_from_config(
            MODELS["kimi-linear"], {k: v for k, v in flat.items() if k != "linear_num_heads"}
        )


@pytest.fixture
def fake_cupy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    import sys

    import fake_cupy

    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    cp = fake_cupy.install(str(tmp_path))
    import specbind.generated.kernels as k

    k.module.cache_clear()
    yield cp
    sys.modules.pop("cupy", None)
    k.module.cache_clear()


@pytest.mark.parametrize("name", ["kimi-linear", "deepseek-v3.2", "deepseek-v3"])
def test_the_device_path_gives_the_numpy_backends_fields_for_the_new_families(
    fake_cupy: Any, tmp_path: Path, name: str
) -> None:
    """The rope slices (a reshape after a strided take) and the new absorbs on the CuPy path
    (a stand-in CuPy on the CPU): the same bytes, the absorbs within one BF16 ulp."""
    import importlib

    from specbind.core.dtypes import within_one_bf16_ulp
    from specbind.generated import MODELS
    from specbind.runtime.bind.bind import bind_checkpoint
    from specbind.runtime.binder import backends
    from specbind.runtime.io.checkpoint import CheckpointDir
    from specbind.synth import synth, tiny_values

    table = MODELS[name]
    synth(table, tmp_path / "ck", tiny_values(table), seed=4)
    ck = CheckpointDir(tmp_path / "ck")
    host = bind_checkpoint(ck, table, tp_size=2, tp_rank=1, progress=False).fields()
    backend = backends.get("cupy", importlib.import_module("specbind.generated.kernels"))
    dev = bind_checkpoint(ck, table, tp_size=2, tp_rank=1, progress=False, backend=backend)
    on_device = dev.fields()
    assert on_device.keys() == host.keys()
    assert any(k.endswith(".q_rope") for k in host)
    for key, (rule, want) in host.items():
        got = backend.to_host(on_device[key][1], rule.dtype)
        assert got.dtype == want.dtype and got.shape == want.shape, key
        if key.endswith("absorb"):
            assert within_one_bf16_ulp(got, want), key
        else:
            assert got.tobytes() == want.tobytes(), key


def _drop_output(root: Path, rel: str, field: str) -> None:
    """Remove one output (its whole YAML entry) from a block spec."""
    p = root / "specs" / rel
    lines = p.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {field}:"))
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith("  ")
         and not lines[i].startswith("    ") and not lines[i].lstrip().startswith("#")),
        len(lines),
    )  # fmt: skip
    p.write_text("".join(lines[:start] + lines[end:]))


@pytest.mark.parametrize(
    ("rel", "field", "tensor", "fragment"),
    [
        (
            "blocks/mla.yaml",
            "q_rope",
            "q_proj.weight",
            "1536 of 3840 elements",
        ),  # heads·rope·hidden of heads·(nope+rope)·hidden
        (
            "blocks/mla_indexed.yaml",
            "k_rope",
            "kv_a_proj_with_mqa.weight",
            "448 of 1456",
        ),  # rope·hidden of (kv_lora_rank+rope)·hidden
    ],
    ids=["kimi-q-rope", "deepseek-k-rope"],
)
def test_dropping_the_rope_rows_is_a_generate_time_error(
    root: Path, rel: str, field: str, tensor: str, fragment: str
) -> None:
    """Without q_rope the absorb still reads q_proj, but only its nope rows: the rope rows would
    be dropped, and the generator says so, counting them."""
    _drop_output(root, rel, field)
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.file == f"specs/{rel}" and e.value.path == f"tensors.{tensor}"
    assert "are read by no output (they would be dropped)" in e.value.message
    assert fragment in e.value.message
