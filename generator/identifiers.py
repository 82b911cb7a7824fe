"""What every spec file passes first: its JSON Schema, then the checks on each identifier and
expression that reaches generated code (shared by block, model, scheme and engine specs).

Invariants (each refusal is a ``SpecError`` naming file, path and line):
- every identifier that reaches generated code (symbols, fields, block names) is a Python
  identifier, not a keyword, not a builtin, not dunder; tensor names reach code only via repr;
- every shape and check parses under the whitelist algebra and uses only declared symbols.
Trap: a symbol becomes a local and an attribute in generated functions, so it may not take the
name of a generated local or module either (``_FORBIDDEN_IDENTS``), nor a field a method's
(``FORBIDDEN_FIELDS``).
"""

from __future__ import annotations

import builtins
import json
import keyword
from functools import cache
from pathlib import Path
from typing import Any, Literal

import jsonschema

from specbind.core import algebra
from specbind.core.errors import AlgebraError
from specbind.core.polynomial import MAX_POWER
from specbind.generator.yamlio import Located, PathKey

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "specs" / "schema"
# Names a symbol may not take: symbols become locals and attributes in generated functions
# (``H = g.H // g.tp``), next to these module names and locals.
_GENERATED_NAMES = {"g", "t", "p", "a", "b", "x", "y", "ops", "algebra_ops", "np", "src", "layer",
                    "rank", "sharded", "report", "weights", "tp", "ep", "self", "cls", "values",
                    "env", "plan", "matches", "ranks", "flags", "counts", "e"}  # fmt: skip
_FORBIDDEN_IDENTS = frozenset(dir(builtins)) | _GENERATED_NAMES
# A field is only ever an attribute and a keyword argument; it may not shadow a method.
FORBIDDEN_FIELDS = frozenset({"arrays", "self"})


@cache
def _schema(kind: str) -> dict[str, Any]:
    defs = {"engine_block": "block_layout", "engine_scheme": "scheme_layout"}
    if kind in defs:  # an engine's block or scheme layout: a definition of the engine schema
        engine = _schema("engine")
        return {"$schema": engine["$schema"], "$defs": engine["$defs"],
                **engine["$defs"][defs[kind]]}  # fmt: skip
    loaded: dict[str, Any] = json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text())
    return loaded


def validate_schema(
    doc: Located,
    kind: Literal["block", "model", "scheme", "engine", "engine_block", "engine_scheme"],
) -> None:
    validator = jsonschema.Draft202012Validator(_schema(kind))
    errors = sorted(
        validator.iter_errors(doc.data),
        key=lambda e: (list(map(str, e.path)), e.message),
    )
    if not errors:
        return
    err = jsonschema.exceptions.best_match(errors) or errors[0]
    path: PathKey = tuple(err.absolute_path)
    if "propertyNames" in err.absolute_schema_path and isinstance(err.instance, str):
        path = (*path, err.instance)  # a bad key: point at the key's own line
    raise doc.error(path, f"schema: {_short(err)}")


def _short(err: jsonschema.ValidationError) -> str:
    msg = str(err.message)
    if len(msg) > 200:
        msg = msg[:200] + "…"
    return msg


def check_ident(
    doc: Located,
    path: PathKey,
    name: str,
    what: str,
    forbidden: frozenset[str] = _FORBIDDEN_IDENTS,
) -> str:
    if (
        not name.isidentifier()
        or keyword.iskeyword(name)
        or keyword.issoftkeyword(name)
        or name.startswith("_")
        or name in forbidden
    ):
        raise doc.error(path, f"{what} {name!r} is not a usable identifier")
    return name


def symbol_expr(
    doc: Located, path: PathKey, text: str | int, allowed: set[str], check: bool
) -> algebra.Expr:
    try:
        e = algebra.parse(text, check=check)
    except AlgebraError as exc:
        raise doc.error(path, str(exc)) from None
    unknown = sorted(e.names - allowed)
    if unknown:
        raise doc.error(path, f"unknown symbol(s) {', '.join(unknown)} in {str(text)!r}")
    _small_powers(doc, path, e)
    return e


# The largest exponent a spec's integer expression may give ``**``: the largest power
# core.polynomial multiplies out, so every power stays one the proofs of a shape can reason
# about; a dimension is never a higher power of another.
MAX_EXPONENT = MAX_POWER


def _small_powers(doc: Located, path: PathKey, e: algebra.Expr) -> None:
    """Each ``**`` of a spec expression raises to an integer literal of at most
    ``MAX_EXPONENT``: ``hidden ** 64 ** 2`` (and ``2 ** hidden``) is refused at generate,
    not found at bind when the value is out of range (or never, where no checkpoint lacks
    the field a ``default`` stands in for)."""
    import ast

    for node in ast.walk(e.node):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            n = node.right
            if not (isinstance(n, ast.Constant) and type(n.value) is int):
                raise doc.error(
                    path,
                    f"the exponent {ast.unparse(n)!r} of ** is not an integer literal (at most "
                    f"{MAX_EXPONENT}): a power by an expression cannot be bounded here",
                )
            if not 0 <= n.value <= MAX_EXPONENT:
                raise doc.error(
                    path,
                    f"the exponent {n.value} of ** is over {MAX_EXPONENT}: no dimension is "
                    "so high a power of another",
                )


def ast_text(e: algebra.Expr) -> str:
    import ast

    return ast.unparse(e.node)
