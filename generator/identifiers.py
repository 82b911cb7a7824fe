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
    if kind == "engine_block":  # an engine's block layout: a definition of the engine schema
        engine = _schema("engine")
        return {"$schema": engine["$schema"], "$defs": engine["$defs"],
                **engine["$defs"]["block_layout"]}  # fmt: skip
    loaded: dict[str, Any] = json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text())
    return loaded


def validate_schema(
    doc: Located, kind: Literal["block", "model", "scheme", "engine", "engine_block"]
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
    return e


def ast_text(e: algebra.Expr) -> str:
    import ast

    return ast.unparse(e.node)
