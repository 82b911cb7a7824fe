"""The shape algebra: a whitelist evaluator over Python's ``ast``, and a renderer to Python.

Grammar: integer literals, symbols, ``+ - * / // % **``, unary ``-``/``+``, parentheses and
the calls ``max(a, b, ...)`` / ``min(a, b, ...)`` (two or more arguments, exact integers);
constraint checks add comparisons, ``and``, ``or`` and ``not``.

Invariants:
- spec text is never passed to ``eval``/``exec``; only the node types below are accepted, and
  anything else (calls, attributes, subscripts, strings, floats) is refused with a message;
- :func:`to_python` renders only accepted nodes, names through a caller-checked mapping, and
  integers through ``repr``, so no spec text reaches generated code verbatim;
- evaluation and generated code share :mod:`core.algebra_ops`, so they agree;
- ``max`` and ``min`` are the only calls, by bare name with positional arguments; they are not
  symbols (``Expr.names`` leaves them out) and a bare ``max`` is refused.
Trap: ``max``/``min`` are not polynomials: a proof that expands shapes (``core.polynomial``)
sees them as opaque, so a sharded dim holding one is refused by the spec checker.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Mapping

from specbind.core import algebra_ops
from specbind.core.errors import AlgebraError
from specbind.core.record import record

MAX_EXPR_LEN = 300
MAX_DEPTH = 32
RESERVED = frozenset({"tp", "ep"})
# The calls the algebra admits, and the ``core.algebra_ops`` helper each renders to.
FUNCTIONS: dict[str, str] = {"max": "maximum", "min": "minimum"}

_ARITH: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}
_CMP: dict[type[ast.cmpop], str] = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
}


@record
class Expr:
    """A parsed, whitelisted expression and the text it came from."""

    text: str
    node: ast.expr

    @property
    def names(self) -> frozenset[str]:
        """The symbols it reads (a call's function name, ``max``/``min``, is none)."""
        calls = {id(n.func) for n in ast.walk(self.node) if isinstance(n, ast.Call)}
        return frozenset(
            n.id for n in ast.walk(self.node) if isinstance(n, ast.Name) and id(n) not in calls
        )

    @property
    def extremum(self) -> bool:
        """It calls ``max`` or ``min`` somewhere."""
        return any(isinstance(n, ast.Call) for n in ast.walk(self.node))


def parse(text: str | int, *, check: bool = False) -> Expr:
    """Parse a shape expression (``check=False``) or a constraint (``check=True``)."""
    if isinstance(text, bool):
        raise AlgebraError(f"{text!r} is a boolean, not an expression")
    if isinstance(text, int):
        if text < 0:
            raise AlgebraError(f"negative literal {text}")
        return Expr(str(text), ast.Constant(text))
    body = _tree(text)
    _validate(body, check=check, top=True, depth=0)
    return Expr(text, body)


def _tree(text: str) -> ast.expr:
    """The expression's syntax tree (not yet whitelisted), or an error for over-long text."""
    if len(text) > MAX_EXPR_LEN:
        raise AlgebraError(f"expression longer than {MAX_EXPR_LEN} characters")
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        hint = ""
        if text.count("(") != text.count(")"):  # YAML's [a, b] splits max(a, b) at its comma
            hint = " (quote an expression holding a comma inside a YAML [...] list)"
        raise AlgebraError(f"cannot parse {text!r}: {e.msg}{hint}") from None


def _validate(node: ast.expr, *, check: bool, top: bool, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise AlgebraError("expression nested too deeply")
    d = depth + 1
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise AlgebraError(f"only integer literals are allowed, not {node.value!r}")
        return
    if isinstance(node, ast.Name):
        if not node.id.isidentifier() or node.id.startswith("_"):
            raise AlgebraError(f"bad symbol name {node.id!r}")
        if node.id in FUNCTIONS:
            raise AlgebraError(f"{node.id} is a function, not a symbol: call it, {node.id}(a, b)")
        return
    if isinstance(node, ast.Call):
        _validate_call(node, d)
        return
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _ARITH:
            raise AlgebraError(f"operator {type(node.op).__name__} is not allowed")
        _validate(node.left, check=False, top=False, depth=d)
        _validate(node.right, check=False, top=False, depth=d)
        return
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.Not) and check:
            _validate(node.operand, check=True, top=True, depth=d)
            return
        if isinstance(node.op, ast.USub | ast.UAdd):
            _validate(node.operand, check=False, top=False, depth=d)
            return
        raise AlgebraError(f"operator {type(node.op).__name__} is not allowed here")
    if check and top and isinstance(node, ast.Compare):
        if any(type(op) not in _CMP for op in node.ops):
            raise AlgebraError("only ==, !=, <, <=, >, >= comparisons are allowed")
        for operand in (node.left, *node.comparators):
            _validate(operand, check=False, top=False, depth=d)
        return
    if check and top and isinstance(node, ast.BoolOp):
        for v in node.values:
            _validate(v, check=True, top=True, depth=d)
        return
    what = type(node).__name__
    if isinstance(node, ast.Compare | ast.BoolOp):
        raise AlgebraError("a comparison is allowed only in a constraint check")
    raise AlgebraError(f"{what} is not allowed in the shape algebra")


def _validate_call(node: ast.Call, depth: int) -> None:
    """``max(a, b, ...)`` / ``min(a, b, ...)``: a bare function name, two or more positional
    integer arguments; no other call, no keywords, no ``*args``."""
    func = node.func.id if isinstance(node.func, ast.Name) else None
    if func not in FUNCTIONS:
        shown = func if func is not None else type(node.func).__name__
        raise AlgebraError(f"call of {shown!r}: only max(...) and min(...) are allowed")
    if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
        raise AlgebraError(f"{func}(...) takes positional arguments only")
    if len(node.args) < 2:
        raise AlgebraError(f"{func}(...) needs two or more arguments, not {len(node.args)}")
    for a in node.args:
        _validate(a, check=False, top=False, depth=depth)


def evaluate(expr: Expr, env: Mapping[str, int]) -> int | bool:
    """Evaluate with exact integer semantics; unknown symbols and bad arithmetic raise."""
    return _eval(expr.node, env)


def _eval(node: ast.expr, env: Mapping[str, int]) -> int | bool:
    if isinstance(node, ast.Constant):
        value = node.value
        assert type(value) is int  # parse() admits integer literals only
        return value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise AlgebraError(f"unknown symbol {node.id!r}")
        return env[node.id]
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not v
        return -int(v) if isinstance(node.op, ast.USub) else int(v)
    if isinstance(node, ast.BinOp):
        a, b = int(_eval(node.left, env)), int(_eval(node.right, env))
        op: type[ast.operator] = type(node.op)
        if op is ast.Add:
            return a + b
        if op is ast.Sub:
            return a - b
        if op is ast.Mult:
            return a * b
        if op is ast.Div:
            return algebra_ops.div(a, b)
        if op is ast.FloorDiv:
            return algebra_ops.floordiv(a, b)
        if op is ast.Mod:
            return algebra_ops.mod(a, b)
        return algebra_ops.power(a, b)
    if isinstance(node, ast.Call):
        assert isinstance(node.func, ast.Name)  # parse() admits max/min by name only
        args = [int(_eval(a, env)) for a in node.args]
        helper = algebra_ops.maximum if node.func.id == "max" else algebra_ops.minimum
        return helper(*args)
    if isinstance(node, ast.Compare):
        left = int(_eval(node.left, env))
        for cmp, comp in zip(node.ops, node.comparators, strict=True):
            right = int(_eval(comp, env))
            if not _compare(type(cmp), left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BoolOp):
        vals = (bool(_eval(v, env)) for v in node.values)
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    raise AlgebraError(f"{type(node).__name__} is not allowed")  # unreachable after parse


def _compare(op: type[ast.cmpop], a: int, b: int) -> bool:
    if op is ast.Eq:
        return a == b
    if op is ast.NotEq:
        return a != b
    if op is ast.Lt:
        return a < b
    if op is ast.LtE:
        return a <= b
    if op is ast.Gt:
        return a > b
    return a >= b


_HELPER = {ast.Div: "div", ast.FloorDiv: "floordiv", ast.Mod: "mod", ast.Pow: "power"}


def to_python(expr: Expr, name: Callable[[str], str]) -> str:
    """Render as Python source; ``name`` maps a symbol to a checked Python expression.

    ``/ // % **`` and ``max``/``min`` become calls into :mod:`core.algebra_ops` (exact,
    zero-checked, bounded); ``ast.unparse`` of the rewritten, already-whitelisted tree
    supplies minimal parentheses.
    """
    return ast.unparse(_Rewrite(name).visit(copy.deepcopy(expr.node)))


class _Rewrite(ast.NodeTransformer):
    def __init__(self, name: Callable[[str], str]) -> None:
        self._name = name

    def visit_Name(self, node: ast.Name) -> ast.expr:
        target = self._name(node.id)
        if not all(part.isidentifier() for part in target.split(".")):
            raise AlgebraError(f"symbol {node.id!r} maps to a non-identifier {target!r}")
        return ast.parse(target, mode="eval").body

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        helper = _HELPER.get(type(node.op))
        if helper is None:
            return node
        func = ast.Attribute(ast.Name("algebra_ops", ast.Load()), helper, ast.Load())
        return ast.Call(func, [node.left, node.right], [])

    def visit_Call(self, node: ast.Call) -> ast.expr:
        assert isinstance(node.func, ast.Name)  # parse() admits max/min by name only
        args = [self.visit(a) for a in node.args]
        helper = FUNCTIONS[node.func.id]
        func = ast.Attribute(ast.Name("algebra_ops", ast.Load()), helper, ast.Load())
        return ast.Call(func, args, [])


# --- real-valued expressions (a ``scale``): floats allowed, ``/`` and ``**`` are real ----------


def parse_real(text: str | int | float) -> Expr:
    """Parse a scale factor such as ``IH ** -0.5``: numbers, symbols, ``+ - * / **``."""
    if isinstance(text, bool):
        raise AlgebraError(f"{text!r} is a boolean, not an expression")
    if isinstance(text, int | float):
        text = repr(text)
    body = _tree(text)
    _validate_real(body, 0)
    return Expr(text, body)


_REAL_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)


def _validate_real(node: ast.expr, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise AlgebraError("expression nested too deeply")
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):
            raise AlgebraError(f"only numbers are allowed, not {node.value!r}")
        return
    if isinstance(node, ast.Name):
        if not node.id.isidentifier() or node.id.startswith("_"):
            raise AlgebraError(f"bad symbol name {node.id!r}")
        return
    if isinstance(node, ast.BinOp) and isinstance(node.op, _REAL_OPS):
        _validate_real(node.left, depth + 1)
        _validate_real(node.right, depth + 1)
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        _validate_real(node.operand, depth + 1)
        return
    raise AlgebraError(f"{type(node).__name__} is not allowed in a scale")


def evaluate_real(expr: Expr, env: Mapping[str, int]) -> float:
    return _eval_real(expr.node, env)


def _eval_real(node: ast.expr, env: Mapping[str, int]) -> float:
    if isinstance(node, ast.Constant):
        assert type(node.value) in (int, float)
        return float(node.value)  # type: ignore[arg-type]
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise AlgebraError(f"unknown symbol {node.id!r}")
        return float(env[node.id])
    if isinstance(node, ast.UnaryOp):
        v = _eval_real(node.operand, env)
        return -v if isinstance(node.op, ast.USub) else v
    assert isinstance(node, ast.BinOp)
    a, b = _eval_real(node.left, env), _eval_real(node.right, env)
    if isinstance(node.op, ast.Add):
        return a + b
    if isinstance(node.op, ast.Sub):
        return a - b
    if isinstance(node.op, ast.Mult):
        return a * b
    if isinstance(node.op, ast.Div):
        return algebra_ops.rdiv(a, b)
    return algebra_ops.rpow(a, b)


def to_python_real(expr: Expr, name: Callable[[str], str]) -> str:
    """Python source for a real expression; ``/`` and ``**`` go through checked helpers."""
    return ast.unparse(_RealRewrite(name).visit(copy.deepcopy(expr.node)))


class _RealRewrite(_Rewrite):
    def visit_Constant(self, node: ast.Constant) -> ast.expr:
        return ast.Constant(float(node.value))  # type: ignore[arg-type]

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        helper = {ast.Div: "rdiv", ast.Pow: "rpow"}.get(type(node.op))
        if helper is None:
            return node
        func = ast.Attribute(ast.Name("algebra_ops", ast.Load()), helper, ast.Load())
        return ast.Call(func, [node.left, node.right], [])
