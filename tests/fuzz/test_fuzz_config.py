"""Fuzzing the config readers: each model's synthetic config.json (flat, or nested under
``text_config``) with one path set to a hostile value or removed, read as a bind reads it
(geometry, flags, per-layer lists and counts through the layout, ``quantization_config``); and
each quantization scheme's config files with one field broken, read by ``detect`` and asked
which modules are quantized. Only specbind's own errors may come out, in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fuzz_docs import DELETE, HOSTILE, VALUES, edited, paths
from fuzz_tally import planned, tally
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specbind.core.errors import SpecbindError
from specbind.core.patterns import fill
from specbind.generated import MODELS
from specbind.runtime.binder.tables import ModelTable
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.layout.config import config_flags, quantization_config, values_from_config
from specbind.runtime.layout.slots import layout
from specbind.runtime.quant.scheme import detect
from specbind.synth import block_tensors, config_for, schedule, tiny_values
from specbind.synth.quant import quant_config_files

CONFIG = "config.json"
QUANT = "quant configs"


def names_of(table: ModelTable[Any], layers: int) -> list[str]:
    """The tensor names ``specbind synth`` writes for ``layers`` decoder layers (and MTP)."""
    g = table.make_geometry(tiny_values(table))
    out: list[str] = []
    for p in schedule(table, layers):
        pre = fill(table.layer_pattern, p.index)
        for b in p.blocks.values():
            out += [pre + n for n, _, _ in block_tensors(table.block(b), g, p.groups, False)]
    if table.globals is not None:
        block = table.block(table.globals)
        groups = frozenset(t.group for t in block.tensors if t.group is not None)
        out += [n for n, _, _ in block_tensors(block, g, groups, False)]
    return out


def base_config(table: ModelTable[Any], nested: bool) -> dict[str, Any]:
    cfg = config_for(table, tiny_values(table), schedule(table, 3))
    if nested:
        assert table.synth is not None
        cfg = json.loads(table.synth.nested_json) | {"text_config": cfg}
    return cfg


BASES = {(m, nested): base_config(t, nested) for m, t in MODELS.items() for nested in (False, True)}
NAMES = {m: names_of(t, 3) for m, t in MODELS.items()}


def candidates(model: str, nested: bool) -> list[tuple[str | int, ...]]:
    """Every path of the base config, and each geometry field at the scope it is not in."""
    out = paths(BASES[(model, nested)])
    for f in MODELS[model].geometry_fields:
        for p in (f.config, *f.also) if f.config else ():
            out.append(tuple(p.split(".")) if nested else ("text_config", *p.split(".")))
    return out


Where = tuple[str, bool, tuple[str | int, ...]]  # (model, nested, a path in its config)
WHERE = st.sampled_from([(*key, p) for key in sorted(BASES) for p in candidates(*key)])
EDITS = st.sampled_from(["set", "set", "set", "delete"])


@settings(max_examples=planned(CONFIG, 22))
@given(WHERE, EDITS, VALUES)
@example(("glm-5.3-flash", False, ()), "set", [])  # the whole config a list
def test_a_config_with_one_path_broken_raises_only_specbind_errors(
    where: Where, how: str, value: Any
) -> None:
    tally(CONFIG)
    model, nested, path = where
    table = MODELS[model]
    cfg = edited(BASES[(model, nested)], path, DELETE if how == "delete" else value)
    if not isinstance(cfg, dict):
        return  # CheckpointDir refuses a config.json that is no object before any field is read
    for read in (
        lambda: values_from_config(table, cfg),
        lambda: config_flags(table, cfg),
        lambda: quantization_config(cfg),
        lambda: layout(table, NAMES[model], cfg).problems,
    ):
        try:
            read()
        except SpecbindError as e:
            assert "\n" not in str(e), str(e)


# The quantization configs: each scheme's files as a tool writes them (``synth --quant``),
# then one field broken: set to a hostile value or a list of hostile patterns, removed, a
# second scheme announced, or a whole file replaced by bytes that are no JSON object.
SCHEMES = {s.name: s for t in MODELS.values() for s in t.schemes}
TABLE = MODELS["deepseek-v3.2"]
MODULES = [
    "model.layers.0.mlp.down_proj",
    "model.layers.0.self_attn.q_a_proj",
    "model.layers.1.mlp.experts.3.gate_proj",
    "lm_head",
    "",
]
EXCLUDED = ["model.layers.0.mlp.down_proj", "lm_head", "*.gate_proj"]
# Patterns as a config may write them: valid and invalid regexes and globs, and ones that make
# a backtracking engine run for ever (the matcher is linear-time, so here they finish at once).
PATTERNS = st.sampled_from(
    ["re:.*mlp.*", "re:model\\.layers\\.\\d+\\.mlp\\..*", "re:(", "re:[", "re:\\", "re:",
     "re:a{4294967296}", "re:" + "(" * 1200 + ")" * 1200, "re:(?P<x>a)(?P=y)", "re:(?<=a+)b",
     "re:\\N{NOPE}", "re:(?i)LM_HEAD", "re:[z-a]", "re:\ud800", "Linear", "", "*", "[", "[!",
     "[a-", "**", "model.layers.*", "*.down_proj", "\x00", "\ud800", "lm_head",
     "re:(\\w+\\.?)+x$", "re:(.*.*)*z$", "re:(a|aa)+$", "*a?????????????????????"]
) | st.text(alphabet="re:.\\[](){}?|^$ab0-*+,", max_size=10)  # fmt: skip
QUANT_EDITS = st.sampled_from(["set", "set", "pattern", "pattern", "delete", "second", "file"])
SIDE_FILES = st.sampled_from(["config.json", "hf_quant_config.json"])


def quant_files(scheme: str) -> dict[str, Any]:
    files: dict[str, Any] = quant_config_files(SCHEMES[scheme], EXCLUDED)
    files["config.json"] = BASES[(TABLE.name, False)] | files.get("config.json", {})
    return files


def lookup(doc: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


QUANT_BASES = {s: quant_files(s) for s in SCHEMES}
QWhere = tuple[str, str, tuple[str | int, ...]]  # (scheme, file, a path in it)
QUANT_WHERE = st.sampled_from(
    [(s, fn, p) for s, files in sorted(QUANT_BASES.items()) for fn, doc in files.items()
     for p in paths(doc, 6) if fn != "config.json" or p[:1] == ("quantization_config",)]
    + [(s, "config.json", ("quantization_config", "config_groups", "group_0", "input_activations"))
       for s in sorted(SCHEMES)]
)  # fmt: skip


@pytest.fixture(scope="module")
def quant_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-quant")
    (root / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    return root


@st.composite
def broken_quant_files(draw: st.DrawFn) -> tuple[str, dict[str, bytes]]:
    """(scheme, the files by name), one thing broken: ``set`` puts a hostile value at a path,
    ``pattern`` a hostile pattern first in the scheme's exclude list (or its targets),
    ``second`` announces every scheme at once, ``file`` makes a whole file no object. Each
    draw is made only when needed: a draw is most of an example's cost."""
    scheme, fn, path = draw(QUANT_WHERE)
    how = draw(QUANT_EDITS)
    files = dict(QUANT_BASES[scheme])
    if how in ("set", "delete"):
        files[fn] = edited(files[fn], path, DELETE if how == "delete" else draw(VALUES))
    elif how == "pattern":
        rule = SCHEMES[scheme]
        fn, field = (rule.exclude.file, rule.exclude.field)
        if rule.targets is not None and draw(st.booleans()):
            fn, field = "config.json", rule.targets.replace("*", "group_0")
        files[fn] = edited(files[fn], (*field.split("."), 0), draw(PATTERNS))
    elif how == "second":
        for other in SCHEMES.values():
            for fn, doc in quant_config_files(other, []).items():
                for p in paths(doc, 6):
                    if p and not isinstance(lookup(doc, p), dict):
                        files[fn] = edited(files.get(fn, {}), p, lookup(doc, p))
    raw = {fn: json.dumps(doc).encode() for fn, doc in files.items()}
    if how == "file":
        raw[draw(SIDE_FILES)] = draw(HOSTILE).encode()
    return scheme, raw


def ct_ignoring(pattern: str) -> tuple[str, dict[str, bytes]]:
    """The compressed-tensors NVFP4 files with ``pattern`` first in ``ignore``."""
    files = dict(QUANT_BASES["nvfp4-compressed-tensors"])
    files["config.json"] = edited(
        files["config.json"], ("quantization_config", "ignore", 0), pattern
    )
    return "nvfp4-compressed-tensors", {fn: json.dumps(doc).encode() for fn, doc in files.items()}


@settings(max_examples=planned(QUANT, 18))
@given(broken_quant_files())
@example(ct_ignoring("re:a{4294967296}"))  # OverflowError from re
@example(ct_ignoring("re:" + "(" * 1200 + ")" * 1200))  # RecursionError from re's parser
@example(ct_ignoring("re:\ud800"))  # UnicodeEncodeError from RE2 (it compiles UTF-8)
def test_quant_configs_with_one_field_broken_raise_only_specbind_errors(
    quant_dir: Path, case: tuple[str, dict[str, bytes]]
) -> None:
    tally(QUANT)
    for fn in ("config.json", "hf_quant_config.json"):
        (quant_dir / fn).unlink(missing_ok=True)
    for fn, data in case[1].items():
        (quant_dir / fn).write_bytes(data)
    try:
        q = detect(CheckpointDir(quant_dir), TABLE.schemes)
        for module in MODULES:
            if q is not None:
                q.quantized(module, [module.replace("model.", "model.language_model.")])
                q.why_excluded(module)
    except SpecbindError as e:
        assert "\n" not in str(e), str(e)
