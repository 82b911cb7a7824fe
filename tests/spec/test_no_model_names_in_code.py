"""No Python in runtime/, generator/ or core/ names a model, a block or a tensor: what a model
is lives in specs/ alone, so a new family is a YAML edit plus ``specbind generate``.

The names are collected from the specs themselves (every model, every model_type, every
block, every tensor's layer-relative name and the underscored parts of it, every block
prefix and name-map name), so a new spec extends the check by itself. A hit is a name in a
code token: an identifier equal to it, or a string literal (not a docstring) containing it
as a word (templates: any word). Comments and docstrings may name anything: they explain,
they do not decide.
Trap: short common words that are also block names (``dense``, ``moe``) would match English
in a string, so a string hit must be the whole literal or a dotted/underscored part of it.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CODE = ("runtime", "generator", "core")
_PLACEHOLDER = re.compile(r"\{[a-z]\}")


def spec_names() -> dict[str, str]:
    """Every name the specs own -> where it comes from."""
    out: dict[str, str] = {}
    for p in sorted((REPO / "specs" / "blocks").glob("*.yaml")):
        d = yaml.safe_load(p.read_text())
        out[d["block"]] = f"block {p.name}"
        if d["prefix"]:
            out[d["prefix"].rstrip(".")] = f"prefix of {p.name}"
        for name in d["tensors"]:
            for n in (name, d["prefix"] + name):
                out[_PLACEHOLDER.sub("0", n)] = f"tensor of {p.name}"
            for part in name.split("."):
                if "_" in part or part[:1].isupper():
                    out[part] = f"part of tensor {name} in {p.name}"
    for p in sorted((REPO / "specs" / "models").glob("*.yaml")):
        d = yaml.safe_load(p.read_text())
        out[d["model"]] = f"model {p.name}"
        out[d["model"].replace("-", "_").replace(".", "_")] = f"model {p.name}"
        for t in d.get("model_types") or []:
            out[t] = f"model_type of {p.name}"
        for r in d.get("names") or []:
            for n in [r["from"], *([r["to"]] if isinstance(r["to"], str) else r["to"])]:
                for part in _PLACEHOLDER.sub("0", n).strip("._").split("."):
                    if "_" in part:
                        out[part] = f"name map of {p.name}"
    return out


def _docstring_lines(source: str) -> set[int]:
    """The lines of every string token that is a statement on its own (a docstring)."""
    lines: set[int] = set()
    toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT}
    prev = tokenize.NEWLINE
    for i, t in enumerate(toks):
        if t.type == tokenize.STRING and prev in (tokenize.NEWLINE, tokenize.INDENT,
                                                  tokenize.DEDENT):  # fmt: skip
            nxt = next(
                (u for u in toks[i + 1 :] if u.type not in (tokenize.NL, tokenize.COMMENT)), None
            )
            if nxt is None or nxt.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                lines |= set(range(t.start[0], t.end[0] + 1))
        if t.type not in skip or t.type == tokenize.NEWLINE:
            prev = t.type if t.type != tokenize.OP or t.string != ":" else tokenize.NEWLINE
    return lines


def _words(literal: str) -> set[str]:
    """A string literal's whole text and its dotted / underscored / braced parts."""
    text = _PLACEHOLDER.sub("0", literal)
    parts = {text, *re.split(r"[^A-Za-z0-9_.\-]+", text)}
    for p in list(parts):
        parts |= set(p.split("."))
        parts.add(p.strip("."))
    return {p for p in parts if p}


def hits(source: str, names: dict[str, str]) -> list[tuple[int, str, str]]:
    docs = _docstring_lines(source)
    out = []
    for t in tokenize.generate_tokens(io.StringIO(source).readline):
        if t.type == tokenize.NAME and t.string in names:
            out.append((t.start[0], t.string, names[t.string]))
        elif t.type == tokenize.STRING and t.start[0] not in docs:
            body = t.string.split(t.string[-1], 1)[1] if t.string[-1] in "'\"" else t.string
            for w in _words(body):
                if w in names:
                    out.append((t.start[0], w, names[w]))
    return out


def test_the_specs_name_what_the_check_looks_for() -> None:
    names = spec_names()
    for expected in ("kda", "moe", "q_b_proj", "A_log", "glm-5.3-flash", "kimi-linear"):
        assert expected in names, expected
    assert "self_attn.q_proj.weight" in names and "experts.0.gate_proj.weight" in names


def test_the_check_finds_a_name_in_code_and_not_in_comments_or_docstrings() -> None:
    names = spec_names()
    src = (
        '"""Module doc naming kv_b_proj and kda."""\n'
        "# a comment naming q_b_proj\n"
        "def f(x):\n"
        '    """Doc naming A_log."""\n'
        '    return x["self_attn.kv_b_proj.weight"], kda\n'
    )
    found = {(line, w) for line, w, _ in hits(src, names)}
    assert (5, "kv_b_proj") in found and (5, "kda") in found
    assert not {line for line, _ in found} - {5}


@pytest.mark.parametrize("folder", CODE)
def test_no_python_in_the_package_names_a_model_block_or_tensor(folder: str) -> None:
    names = spec_names()
    bad = []
    for p in sorted((REPO / folder).rglob("*.py")):
        for line, word, why in hits(p.read_text(), names):
            bad.append(f"{p.relative_to(REPO)}:{line}: {word!r} ({why})")
    assert not bad, "\n".join(bad)


def test_no_template_names_a_model_block_or_tensor() -> None:
    """The generator's templates hold no comments worth exempting: any word is a hit."""
    names = spec_names()
    bad = []
    for p in sorted((REPO / "generator" / "templates").rglob("*.j2")):  # fields/ too
        for i, line in enumerate(p.read_text().splitlines(), 1):
            for word in _words(line):
                if word in names:
                    bad.append(f"{p.relative_to(REPO)}:{i}: {word!r} ({names[word]})")
    assert not bad, "\n".join(bad)
