"""The shape algebra: a whitelist, exact integer semantics, and generated code that agrees."""

from __future__ import annotations

import ast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specbind.core import algebra, algebra_ops
from specbind.core.errors import AlgebraError, GeometryError


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "H.__class__",
        "H[0]",
        "f(H)",
        "lambda: 1",
        "'H'",
        "1.5 * H",
        "H if D else X",
        "[H, D]",
        "H and D",  # a boolean in a shape
        "H < D",  # a comparison in a shape
        "~H",
        "H << 2",
        "H @ D",
        "_secret",
    ],
)
def test_anything_outside_the_whitelist_is_refused(text: str) -> None:
    with pytest.raises(AlgebraError):
        algebra.parse(text)


def test_a_check_may_compare_and_combine_but_still_not_call() -> None:
    e = algebra.parse("H % tp == 0 and not D < 1", check=True)
    assert algebra.evaluate(e, {"H": 8, "tp": 2, "D": 4}) is True
    with pytest.raises(AlgebraError):
        algebra.parse("len(H) == 0", check=True)


def test_division_is_exact_or_refused() -> None:
    assert algebra.evaluate(algebra.parse("H / tp"), {"H": 64, "tp": 8}) == 8
    with pytest.raises(GeometryError, match="not exact"):
        algebra.evaluate(algebra.parse("H / tp"), {"H": 64, "tp": 3})
    with pytest.raises(GeometryError, match="division by zero"):
        algebra.evaluate(algebra.parse("H // tp"), {"H": 64, "tp": 0})


def test_unknown_symbols_and_huge_powers_are_refused() -> None:
    with pytest.raises(AlgebraError, match="unknown symbol 'Z'"):
        algebra.evaluate(algebra.parse("Z + 1"), {})
    with pytest.raises(GeometryError):
        algebra.evaluate(algebra.parse("2 ** 999999"), {})
    with pytest.raises(GeometryError, match="negative exponent"):
        algebra.evaluate(algebra.parse("2 ** -1"), {})


def test_overlong_and_deeply_nested_expressions_are_refused() -> None:
    with pytest.raises(AlgebraError, match="longer than"):
        algebra.parse("H + " * 100 + "H")
    with pytest.raises(AlgebraError, match="nested too deeply"):
        algebra.parse("(" * 40 + "H" + ")" * 40 + " + -" * 40 + "H")


SYMS = ["H", "D", "X", "tp"]


def _exprs() -> st.SearchStrategy[str]:
    leaves = st.one_of(st.sampled_from(SYMS), st.integers(0, 9).map(str))
    ops = st.sampled_from(["+", "-", "*", "/", "//", "%", "**"])

    def extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        binop = st.tuples(children, ops, children).map(lambda t: f"({t[0]} {t[1]} {t[2]})")
        neg = children.map(lambda c: f"-{c}")
        return st.one_of(binop, neg)

    return st.recursive(leaves, extend, max_leaves=8)


@given(_exprs(), st.fixed_dictionaries({s: st.integers(0, 12) for s in SYMS}))
def test_generated_python_agrees_with_the_evaluator(text: str, env: dict[str, int]) -> None:
    expr = algebra.parse(text)
    src = algebra.to_python(expr, lambda s: f"g.{s}")
    tree = ast.parse(src, mode="eval")
    assert not any(
        isinstance(n, ast.Call) and not isinstance(n.func, ast.Attribute) for n in ast.walk(tree)
    )
    g = type("G", (), dict(env))
    code = compile(tree, "<generated>", "eval")
    try:
        want: object = algebra.evaluate(expr, env)
    except GeometryError as e:
        want = type(e)
    try:
        got: object = eval(code, {"__builtins__": {}, "algebra_ops": algebra_ops, "g": g})
    except GeometryError as e:
        got = type(e)
    assert got == want, src
