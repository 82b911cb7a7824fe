"""Patterns from a checkpoint's config run in bounded time with the tools' verdicts: a hostile
regex or a huge glob list gets its verdict at once (in a subprocess with a generous CPU bound,
tests/support/patience.py, so a runaway match fails the test instead of stalling the suite,
whatever the machine's load), a construct the linear-time engine cannot
run is refused naming the file and the entry, the caps are refused naming the file and field,
and benign patterns match exactly the names Python's ``re.match`` and ``fnmatchcase`` do."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import patience
import pytest
from budget import examples
from helpers import TABLE, TINY
from hypothesis import given, settings
from hypothesis import strategies as st

from specbind.core import config_patterns
from specbind.core.config_patterns import MAX_COMPILED, MAX_ENTRIES, NameMatcher
from specbind.core.errors import CheckpointError
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import MAX_CONFIG_BYTES, CheckpointDir
from specbind.synth import synth

# every linear NVFP4, as in test_quant_claims
GEO = TINY | {
    "hidden": 128, "intermediate": 128, "moe_intermediate": 64, "v_head_dim": 32,
    "q_lora_rank": 48, "kv_lora_rank": 32,
}  # fmt: skip
SCHEMES = {s.name: s for s in TABLE.schemes}
CT = "nvfp4-compressed-tensors"
MO = "nvfp4-modelopt"
IGNORE = "config.json quantization_config.ignore"
TARGETS = "config.json quantization_config.config_groups.*.targets"
EXCLUDE = "hf_quant_config.json quantization.exclude_modules"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in (CT, MO):
        d = tmp_path_factory.mktemp("patterns") / name
        synth(TABLE, d, GEO, layers=3, seed=3, quant=SCHEMES[name])
        out[name] = d
    return out


def with_ct(src: Path, dest: Path, **fields: Any) -> Path:
    """A copy of a compressed-tensors checkpoint with ``quantization_config`` fields replaced
    (``targets`` goes into config group 0)."""
    dest.mkdir()
    for f in src.iterdir():
        os.link(f, dest / f.name)  # a symlink out of the folder is refused
    (dest / "config.json").unlink()
    cfg = json.loads((src / "config.json").read_text())
    qc = cfg["quantization_config"]
    if "targets" in fields:
        qc["config_groups"]["group_0"]["targets"] = fields.pop("targets")
    qc.update(fields)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def with_excluded(src: Path, dest: Path, exclude: list[str]) -> Path:
    dest.mkdir()
    for f in src.iterdir():
        if f.name != "hf_quant_config.json":
            os.link(f, dest / f.name)  # a symlink out of the folder is refused
    doc = {"quantization": {"quant_algo": "NVFP4", "exclude_modules": exclude}}
    (dest / "hf_quant_config.json").write_text(json.dumps(doc))
    return dest


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``specbind ARGS``; a run past the generous CPU bound (or a hang) fails the test."""
    return patience.run(
        [sys.executable, "-m", "specbind", *args, "--no-progress"],
        capture_output=True, text=True, cpu=60,
    )  # fmt: skip


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)  # refused
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specbind: error: "), proc.stderr
    return lines[0]


def refused(path: Path) -> str:
    with pytest.raises(CheckpointError) as e:
        bind_checkpoint(CheckpointDir(path), TABLE, progress=False)
    return str(e.value)


# --- hostile input from the issue: a verdict at once ----------------------------------------


def test_a_catastrophic_ignore_regex_gets_its_verdict_at_once(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    d = with_ct(ckpts[CT], tmp_path / "c", ignore=[r"re:(\w+\.?)+x$"])
    for cmd in ("bind", "audit"):
        proc = cli(cmd, str(d))
        assert proc.returncode == 0, proc.stderr  # no module name ends in x: nothing ignored


def test_a_catastrophic_target_regex_gets_its_verdict_at_once(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    d = with_ct(ckpts[CT], tmp_path / "c", targets=["re:(.*.*)*z$"])
    msg = one_line(cli("bind", str(d)))
    assert "is excluded from quantization (no target of config.json config_groups" in msg


def test_two_hundred_thousand_wildcard_globs_are_refused_at_once_naming_the_field(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    globs = [f"model.layers.{i}.mlp.experts.{i % 384}.*_proj_{i}" for i in range(200_000)]
    d = with_excluded(ckpts[MO], tmp_path / "c", globs)
    assert (d / "hf_quant_config.json").stat().st_size > 9_000_000
    msg = one_line(cli("bind", str(d)))
    assert f"{EXCLUDE}: 200000 wildcard globs" in msg and f"cap of {MAX_COMPILED}" in msg


def test_two_hundred_thousand_plain_names_are_matched_at_once(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    names = [f"model.layers.{i}.mlp.experts.{i % 384}.gate_proj" for i in range(200_000)]
    d = with_excluded(ckpts[MO], tmp_path / "c", names)
    proc = cli("bind", str(d))
    assert proc.returncode == 0, proc.stderr  # none of them is a module of this checkpoint
    d2 = with_excluded(ckpts[MO], tmp_path / "d", [*names, "layers.1.mlp.down_proj"])
    assert "lists 'layers.1.mlp.down_proj'" in one_line(cli("bind", str(d2)))


# --- what the linear-time engine cannot run, and the caps -----------------------------------


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (r"re:(\w)\1", "invalid escape sequence: \\1"),
        ("re:.*(?=mlp)", "invalid perl operator: (?="),
        ("re:(?<!x)mlp", "invalid perl operator: (?<"),
        (r"re:.*proj\Z", "invalid escape sequence: \\Z"),
    ],
)
def test_a_regex_construct_the_linear_engine_cannot_run_is_refused_naming_the_entry(
    ckpts: dict[str, Path], tmp_path: Path, entry: str, why: str
) -> None:
    for field in ("ignore", "targets"):
        d = with_ct(ckpts[CT], tmp_path / field, **{field: [entry]})
        msg = refused(d)
        where = IGNORE if field == "ignore" else TARGETS
        assert msg.startswith(f"{where} entry {entry!r}: not runnable by the linear-time"), msg
        assert why in msg


@pytest.mark.parametrize("entry", ["re:.*mlp.{,3}proj", "re:.*[[:digit:]].mlp"])
def test_a_regex_the_two_engines_read_differently_is_refused(
    ckpts: dict[str, Path], tmp_path: Path, entry: str
) -> None:
    msg = refused(with_ct(ckpts[CT], tmp_path / "c", ignore=[entry]))
    assert msg.startswith(f"{IGNORE} entry {entry!r}: uses ") and "differently" in msg


def test_an_invalid_regex_is_refused_naming_the_entry(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    msg = refused(with_ct(ckpts[CT], tmp_path / "c", ignore=["re:layers.(0"]))
    assert msg.startswith(f"{IGNORE} entry 're:layers.(0': not a valid regular expression")


@pytest.mark.parametrize(
    ("field", "entries", "said"),
    [
        ("ignore", [f"m.{i}" for i in range(MAX_ENTRIES + 1)],
         f"{IGNORE}: {MAX_ENTRIES + 1} entries, over the cap"),
        ("targets", [f"re:layers.{i}.mlp" for i in range(MAX_COMPILED + 1)],
         f"{TARGETS}: {MAX_COMPILED + 1} re: regexes"),
    ],
    ids=["entries", "regexes"],
)  # fmt: skip
def test_a_field_over_its_cap_is_refused_naming_the_file_and_field(
    ckpts: dict[str, Path], tmp_path: Path, field: str, entries: list[str], said: str
) -> None:
    d = with_ct(ckpts[CT], tmp_path / "c", **{field: entries})
    assert refused(d).startswith(said)


@pytest.mark.parametrize("file", ["config.json", "hf_quant_config.json"])
def test_a_config_file_over_the_size_cap_is_refused_naming_the_file(
    ckpts: dict[str, Path], tmp_path: Path, file: str
) -> None:
    src = ckpts[MO]
    d = with_excluded(src, tmp_path / "c", [])
    doc = json.loads((d / file).read_text())
    doc["padding"] = "x" * MAX_CONFIG_BYTES
    (d / file).unlink()
    (d / file).write_text(json.dumps(doc))
    with pytest.raises(CheckpointError) as e:
        bind_checkpoint(CheckpointDir(d), TABLE, progress=False)
    assert str(e.value).startswith(f"{file}: ") and f"over the {MAX_CONFIG_BYTES} B cap" in str(
        e.value
    )


def test_matching_past_the_time_budget_is_refused_naming_the_field(
    ckpts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config_patterns, "MATCH_BUDGET_S", 0.0)
    d = with_excluded(ckpts[MO], tmp_path / "c", ["*.never_*"])
    msg = refused(d)
    assert msg.startswith(f"{EXCLUDE}: matching its 1 patterns against the checkpoint's")


# --- benign patterns: the tools' own verdicts -----------------------------------------------

# What llmcompressor recipes write into ``ignore`` (its examples and the published checkpoints).
LLMCOMPRESSOR_IGNORE = [
    "lm_head",
    "re:.*mlp.gate$",
    "re:.*mlp.shared_expert_gate$",
    "re:.*self_attn.*",
    "re:model.layers.0.*",
    "re:.*norm.*",
    "re:visual.*",
    "re:.*embed_tokens",
]
MODULES = [
    f"{p}layers.{i}.{m}"
    for p in ("", "model.")
    for i in (0, 1, 12)
    for m in (
        "mlp.gate", "mlp.gate_proj", "mlp.experts.3.down_proj", "mlp.shared_expert_gate",
        "self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa", "input_layernorm",
    )
] + ["lm_head", "model.embed_tokens", "visual.blocks.0.attn.qkv"]  # fmt: skip


def test_an_llmcompressor_ignore_list_matches_the_modules_python_re_matches() -> None:
    m = NameMatcher(LLMCOMPRESSOR_IGNORE, "compressed_tensors", IGNORE)
    for name in MODULES:
        want = any(
            re.match(p[3:], name) is not None if p.startswith("re:") else p == name
            for p in LLMCOMPRESSOR_IGNORE
        )
        assert m.matches(name) == want, name


NAME_CHARS = "abgmp_.0123"
names = st.text(NAME_CHARS, max_size=24)
atoms = st.sampled_from(
    ["a", "b", "m", "p", "_", "0", "1", "\\.", ".", "[0-9]", "[ab]", "[^.]", "\\d", "\\w"]
)


@st.composite
def regexes(draw: st.DrawFn, depth: int = 1) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.integers(0, 3 if depth else 1))
        if kind <= 1:  # an atom, any quantifier
            part = draw(atoms) + draw(st.sampled_from(["", "", "*", "+", "?", "{1,2}", "*?"]))
        elif kind == 2:  # a group, optional at most: nested stars would hang the reference
            part = f"({draw(regexes(depth - 1))}|{draw(regexes(depth - 1))})"
        else:
            part = f"(?:{draw(regexes(depth - 1))})"
        parts.append(part if kind <= 1 else part + draw(st.sampled_from(["", "?"])))
    return "".join(parts) + draw(st.sampled_from(["", "$"]))


@given(st.lists(regexes(), min_size=1, max_size=4), st.lists(names, max_size=8))
@settings(max_examples=examples(1))
def test_benign_regexes_match_what_python_re_match_matches(
    patterns: list[str], modules: list[str]
) -> None:
    m = NameMatcher([f"re:{p}" for p in patterns], "compressed_tensors", IGNORE)
    for name in modules:
        assert m.matches(name) == any(re.match(p, name) for p in patterns), (patterns, name)


globs = st.text(NAME_CHARS + "*?[]!-", max_size=12)


@given(st.lists(globs, min_size=1, max_size=4), st.lists(names, max_size=8))
@settings(max_examples=examples(2))
def test_globs_match_what_fnmatchcase_matches(patterns: list[str], modules: list[str]) -> None:
    m = NameMatcher(patterns, "glob", EXCLUDE)
    for name in modules:
        want = any(fnmatch.fnmatchcase(name, p) for p in patterns)
        assert m.matches(name) == want, (patterns, name)
        hit = m.first(name)
        assert (hit is not None) == want and (hit is None or fnmatch.fnmatchcase(name, hit))
