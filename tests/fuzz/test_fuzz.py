"""Fuzzing the spec side: arbitrary text at the YAML loader, documents drawn from the block
schema at the spec checker. Only specbind's own errors may come out, and whatever passes the
checks renders to Python that compiles. (The checkpoint readers' fuzzers are the
``test_fuzz_*.py`` beside this file.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from budget import examples
from hypothesis import event, given, settings
from hypothesis import strategies as st

from specbind.core.errors import SpecbindError, SpecError
from specbind.generator import block_spec, yamlio
from specbind.generator.render import _block_context, _env

# Compiled once: compiling the template is most of the cost of one example.
BLOCK_TEMPLATE = _env().get_template("block.py.j2")
SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "specs/schema/block.schema.json").read_text()
)


@settings(max_examples=examples(5))
@given(st.text(max_size=300))
def test_arbitrary_yaml_text_raises_only_spec_errors(text: str) -> None:
    try:
        yamlio.loads(text, "fuzz.yaml")
    except SpecError as e:
        assert "\n" not in str(e)


yamlish = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=examples(2))
@given(st.dictionaries(st.sampled_from(sorted(SCHEMA["properties"])), yamlish, max_size=8))
def test_arbitrary_documents_raise_only_spec_errors(doc: dict[str, Any]) -> None:
    check_document(doc)


# Near-valid block specs: the right keys, names from a pool that mixes good and hostile ones,
# shapes from the algebra's grammar with the odd foreign token. (hypothesis-jsonschema would draw
# from the schema itself, but its 0.23 release does not run on this Hypothesis.)
NAMES = st.sampled_from(
    ["w.weight", "v.weight", "A_log", "x'.y", "a\nb", "{{ x }}", "__init__", "w"]
)
SYMS = st.sampled_from(["X", "H", "D", "Z", "tp", "lambda", "__class__", "print"])
ATOMS = SYMS | st.integers(0, 9).map(str) | st.sampled_from(["1.5", "f(H)", "H.real", "'s'", "-1"])
EXPRS = st.recursive(
    ATOMS,
    lambda e: st.tuples(e, st.sampled_from([*list("+-*/%"), "//", "**", "<"]), e).map(" ".join),
    max_leaves=5,
)
SHARDS = st.sampled_from(["replicated", {"rows": "H"}, {"cols": "H"}, {"rows": "Z"}, {"cols": "X"}])
TENSOR = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["BF16", "F32", "Q4"]),
        "shape": st.lists(EXPRS | st.integers(-1, 4), min_size=1, max_size=3),
        "shard": SHARDS,
    },
    optional={"group": st.sampled_from(["g", "h"])},
)
OUTPUT = (
    NAMES
    | st.fixed_dictionaries(
        {"concat": st.lists(NAMES, min_size=2, max_size=3), "axis": st.integers(0, 2)},
        optional={"squeeze": st.integers(0, 2)},
    )
    | st.fixed_dictionaries(
        {
            "einsum": st.sampled_from(["hx,hy->hxy", "ab,bc->ac", "hh,hx->hx", "ab,cd->e"]),
            "operands": st.lists(st.fixed_dictionaries({"tensor": NAMES}), min_size=2, max_size=2),
        },
        optional={"dtype": st.sampled_from(["BF16", "F32"]), "scale": EXPRS, "shard": SHARDS},
    )
)
BLOCKS = st.fixed_dictionaries(
    {
        "block": st.sampled_from(["bad", "Bad", "class"]),
        "prefix": st.sampled_from(["self_attn.", "", "x"]),
        "symbols": st.dictionaries(SYMS, st.just("doc"), min_size=1, max_size=4),
        "markers": st.sampled_from(
            [{"all_required": True}, {"all_of": ["w.weight"]}, {"all_of": []}]
        ),
        "tensors": st.dictionaries(NAMES, TENSOR, min_size=1, max_size=3),
        "outputs": st.dictionaries(
            st.sampled_from(["w", "v", "class", "arrays", "a b"]), OUTPUT, min_size=1, max_size=3
        ),
    },
    optional={
        "derived": st.dictionaries(st.sampled_from(["Q", "H", "g"]), EXPRS, max_size=2),
        "constraints": st.lists(
            st.fixed_dictionaries({"name": st.just("c"), "check": EXPRS, "why": st.just("w")}),
            max_size=2,
        ),
        "groups": st.dictionaries(
            st.sampled_from(["g", "h"]),
            st.fixed_dictionaries({"optional": st.booleans(), "why": st.just("w")}),
            max_size=2,
        ),
    },
)


@settings(max_examples=examples(3), deadline=None)
@given(BLOCKS)
def test_hostile_block_specs_fail_cleanly_or_render_to_compilable_python(
    doc: dict[str, Any],
) -> None:
    check_document(doc)


OK_NAMES = st.sampled_from(["w.weight", "v.weight", "A_log"])
OK_EXPRS = st.recursive(
    st.sampled_from(["X", "H", "D", "1", "2", "3"]),
    lambda e: st.tuples(e, st.sampled_from(["+", "*", "//", "%", "**", "/"]), e).map(" ".join),
    max_leaves=4,
)
OK_TENSOR = st.fixed_dictionaries(
    {"dtype": st.sampled_from(["BF16", "F32"]), "shape": st.lists(OK_EXPRS, min_size=1, max_size=3),
     "shard": st.sampled_from(["replicated", {"rows": "H"}, {"cols": "H"}, {"rows": "D"}])}
)  # fmt: skip
OK_OPERAND = st.fixed_dictionaries(
    {"tensor": OK_NAMES},
    optional={"view": st.lists(OK_EXPRS, min_size=1, max_size=3),
              "slice": st.fixed_dictionaries({"axis": st.integers(0, 2)}, optional={"start": OK_EXPRS, "stop": OK_EXPRS})},
)  # fmt: skip
OK_OUTPUTS = st.one_of(
    OK_NAMES,
    st.fixed_dictionaries({"concat": st.lists(OK_NAMES, min_size=2, max_size=3, unique=True), "axis": st.integers(0, 1)},
                          optional={"squeeze": st.integers(0, 2)}),
    st.fixed_dictionaries({"tensor": OK_NAMES},
                          optional={"view": st.lists(OK_EXPRS, min_size=1, max_size=3), "scale": OK_EXPRS,
                                    "dtype": st.sampled_from(["BF16", "F32"]),
                                    "slice": st.fixed_dictionaries({"axis": st.integers(0, 2)}, optional={"stop": OK_EXPRS})}),
    st.fixed_dictionaries({"einsum": st.sampled_from(["hx,hy->hxy", "ab,bc->ac", "hx,hx->h", "xh,hy->xy"]),
                           "operands": st.lists(OK_OPERAND, min_size=2, max_size=2)},
                          optional={"view": st.lists(OK_EXPRS, min_size=1, max_size=2), "scale": OK_EXPRS,
                                    "dtype": st.sampled_from(["BF16", "F32"]),
                                    "shard": st.sampled_from(["replicated", {"rows": "H"}, {"cols": "H"}])}),
)  # fmt: skip
OK_BLOCKS = st.fixed_dictionaries(
    {
        "block": st.just("bad"),
        "prefix": st.just("self_attn."),
        "symbols": st.just({"X": "x", "H": "h", "D": "d"}),
        "markers": st.just({"all_required": True}),
        "tensors": st.dictionaries(OK_NAMES, OK_TENSOR, min_size=1, max_size=3),
        "outputs": st.dictionaries(
            st.sampled_from(["w", "v", "u"]), OK_OUTPUTS, min_size=1, max_size=3
        ),
    },
    optional={
        "derived": st.dictionaries(st.sampled_from(["Q", "R"]), OK_EXPRS, max_size=2),
        "constraints": st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.just("c"),
                    "check": OK_EXPRS.map(lambda e: e + " >= 1"),
                    "why": st.just("w"),
                }
            ),
            max_size=2,
        ),
    },
)


@settings(max_examples=examples(5), deadline=None)
@given(OK_BLOCKS)
def test_plausible_block_specs_fail_cleanly_or_render_to_compilable_python(
    doc: dict[str, Any],
) -> None:
    check_document(doc)


def check_document(doc: dict[str, Any]) -> None:
    located = yamlio.Located("fuzz.yaml", doc, {(): 1})
    try:
        block = block_spec.parse_block(located)
    except SpecbindError as e:
        assert "\n" not in str(e)
        event(f"refused: {str(e).split(': ', 2)[-1][:40]}")
        return
    kinds = {"verbatim" if isinstance(v, str) else "concat" if "concat" in v else "transform"
             for v in doc.get("outputs", {}).values()}  # fmt: skip
    event(f"accepted and rendered: {'+'.join(sorted(kinds))}")
    source = BLOCK_TEMPLATE.render(header="# fuzz", **_block_context(block))
    compile(source, "<generated>", "exec")  # compiles; never executed
