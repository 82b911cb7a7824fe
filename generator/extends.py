"""``extends:`` in a model spec: a model written as its base model plus what differs.

The child's document is merged onto its base's (itself resolved first), then the merged
document is validated and parsed like any other model spec.

Merge rules (a JSON-Merge-Patch-like merge, RFC 7386, widened for lists keyed by name; no
library does keyed lists with line tracking, hence written here):
* a mapping merges key by key, recursively; a key the base lacks is added; ``null`` removes
  an inherited key (one the base lacks is refused: nothing to remove);
* ``blocks`` is keyed by ``block``: an entry for an inherited block merges into it (its
  ``symbols`` map, key by key), a new one is appended; ``names`` (by ``from``), ``unbound``
  (by ``prefix``) and ``constraints`` (by ``name``) replace an entry with the same key, append
  otherwise; every other list (``model_types``, a slot's ``blocks``, ``prefixes``) replaces;
* ``model``, ``doc``, ``model_types`` and ``default`` are never inherited: they say which
  model this is;
* an inherited ``expr`` symbol the child gives no ``value`` is recomputed at the merged
  geometry (its value is a check of the real geometry, which the child may have changed);
* an inherited block that no slot and no ``globals`` names any more (a slot now holds another
  block) is dropped; a block the child lists itself is kept, and refused unplaced as usual.

Refusals (one line each, naming the child's file, key and line): a base that is not a model
in specs/models, a cycle of ``extends``, ``null`` for a key the base lacks, a geometry symbol
the base lacks that nothing (no block symbol, no name rule, no expression) uses — the sign of
a misspelt override.

Trap: the merged document's lines are the child's where the child wrote the value, and the
child's ``extends`` line for everything inherited; an error in an inherited value that the
base alone accepts is therefore reported at ``extends``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

from specbind.core.errors import SpecbindError
from specbind.core.geometry import resolve as resolve_geometry
from specbind.generator.yamlio import Located, PathKey

_OWN = frozenset({"model", "doc", "model_types", "default", "extends"})
# a list merged entry by entry, by the key that names an entry
_KEYED_LISTS: dict[PathKey, str] = {
    ("blocks",): "block", ("names",): "from", ("unbound",): "prefix", ("constraints",): "name",
}  # fmt: skip


def resolve(
    docs: Mapping[str, Located], block_symbols: Mapping[str, Iterable[str]]
) -> dict[str, Located]:
    """Every model document by model name, each ``extends`` merged onto its base.

    ``docs``: the documents as loaded, by their ``model`` value; ``block_symbols``: each
    block's symbol names (a geometry symbol a child adds must be one of them, or be used)."""
    out: dict[str, Located] = {}

    def get(name: str, chain: tuple[str, ...]) -> Located:
        if name in out:
            return out[name]
        doc = docs[name]
        base_name = doc.data.get("extends")
        if base_name is None:
            out[name] = doc
            return doc
        where: PathKey = ("extends",)
        if not isinstance(base_name, str):
            raise doc.error(where, "extends names one model (a string)")
        if base_name not in docs:
            known = ", ".join(sorted(n for n in docs if n != name))
            raise doc.error(where, f"extends {base_name!r}: no such model (models: {known})")
        if base_name in chain:
            cycle = " -> ".join((*chain[chain.index(base_name) :], name, base_name))
            raise doc.error(where, f"extends forms a cycle: {cycle}")
        base = get(base_name, (*chain, name))
        out[name] = _merged(base, doc, base_name, block_symbols)
        return out[name]

    for name in sorted(docs):
        get(name, ())
    return out


def _merged(
    base: Located, child: Located, base_name: str, block_symbols: Mapping[str, Iterable[str]]
) -> Located:
    inherited_line = child.line(("extends",))
    data = {k: copy.deepcopy(v) for k, v in base.data.items() if k not in _OWN}
    lines: dict[PathKey, int] = {(): child.lines.get((), 1)}
    _all_lines(data, (), lines, inherited_line)
    own = {k: v for k, v in child.data.items() if k in _OWN}
    rest = {k: v for k, v in child.data.items() if k not in _OWN}
    _merge_map(data, rest, (), (), child, lines, base_name)
    for k, v in own.items():
        data[k] = copy.deepcopy(v)
        _copy_lines(child, (k,), (k,), v, lines)
    merged = Located(child.file, data, lines)
    _recompute_inherited_exprs(merged, child)
    listed: list[Any] = rest["blocks"] if isinstance(rest.get("blocks"), list) else []
    _drop_unplaced(merged, {b.get("block") for b in listed if isinstance(b, dict)})
    _added_symbols_used(merged, base, child, block_symbols, base_name)
    return merged


def _recompute_inherited_exprs(merged: Located, child: Located) -> None:
    """An inherited ``expr`` symbol whose ``value`` the child leaves alone takes the value its
    expression gives at the merged geometry (the base's value was the base's geometry's)."""
    geo = merged.data.get("geometry")
    own = child.data.get("geometry") or {}
    if not isinstance(geo, dict) or not isinstance(own, dict):
        return
    pending = {n: str(g["expr"]) for n, g in geo.items() if isinstance(g, dict) and "expr" in g
               and not (isinstance(own.get(n), dict) and "value" in own[n])}  # fmt: skip
    known = {n: g["value"] for n, g in geo.items() if isinstance(g, dict) and n not in pending
             and isinstance(g.get("value"), int)}  # fmt: skip
    if not pending:
        return
    try:
        values = resolve_geometry(known, pending)
    except SpecbindError:
        return  # parse_model refuses the expression itself, naming it
    for n in pending:
        geo[n]["value"] = values[n]


def _all_lines(v: Any, path: PathKey, lines: dict[PathKey, int], line: int | None) -> None:
    if line is not None:
        lines[path] = line
    if isinstance(v, dict):
        for k, x in v.items():
            _all_lines(x, (*path, k), lines, line)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _all_lines(x, (*path, i), lines, line)


def _copy_lines(
    child: Located, cpath: PathKey, opath: PathKey, v: Any, lines: dict[PathKey, int]
) -> None:
    """The child's lines of the value at ``cpath``, now at ``opath`` of the merged document."""
    n = len(cpath)
    for p, line in child.lines.items():
        if p[:n] == cpath:
            lines[(*opath, *p[n:])] = line


def _drop_lines(lines: dict[PathKey, int], opath: PathKey) -> None:
    n = len(opath)
    for p in [p for p in lines if p[:n] == opath and len(p) > n]:
        del lines[p]


def _merge_map(
    base: dict[str, Any], child: Mapping[str, Any], cpath: PathKey, opath: PathKey,
    doc: Located, lines: dict[PathKey, int], base_name: str,
) -> None:  # fmt: skip
    for k, v in child.items():
        cp, op = (*cpath, k), (*opath, k)
        if v is None:
            if k not in base:
                where = ".".join(str(x) for x in op)
                raise doc.error(cp, f"null removes an inherited entry, but {base_name} has no "
                                    f"{where}")  # fmt: skip
            del base[k]
            _drop_lines(lines, op)
            lines.pop(op, None)
            continue
        keyed = _KEYED_LISTS.get(op)
        if keyed is not None and isinstance(v, list) and isinstance(base.get(k), list):
            _merge_keyed(base[k], v, keyed, cp, op, doc, lines, base_name)
        elif isinstance(v, dict) and isinstance(base.get(k), dict):
            lines[op] = doc.lines.get(cp, lines.get(op, 1))
            _merge_map(base[k], v, cp, op, doc, lines, base_name)
        else:
            _drop_lines(lines, op)
            base[k] = copy.deepcopy(v)
            _copy_lines(doc, cp, op, v, lines)


def _merge_keyed(
    base: list[Any], child: list[Any], key: str, cpath: PathKey, opath: PathKey,
    doc: Located, lines: dict[PathKey, int], base_name: str,
) -> None:  # fmt: skip
    for i, entry in enumerate(child):
        cp = (*cpath, i)
        if not isinstance(entry, dict) or not isinstance(entry.get(key), str):
            raise doc.error(cp, f"an entry of {'.'.join(map(str, opath))} needs its {key!r}")
        at = next((j for j, b in enumerate(base) if b.get(key) == entry[key]), None)
        if at is None:
            base.append(copy.deepcopy(entry))
            _copy_lines(doc, cp, (*opath, len(base) - 1), entry, lines)
        elif key == "block":  # an inherited block: its symbols map merges
            op = (*opath, at)
            lines[op] = doc.lines.get(cp, 1)
            _merge_map(base[at], entry, cp, op, doc, lines, base_name)
        else:
            op = (*opath, at)
            _drop_lines(lines, op)
            base[at] = copy.deepcopy(entry)
            _copy_lines(doc, cp, op, entry, lines)


def _drop_unplaced(doc: Located, own_blocks: set[Any]) -> None:
    """Inherited blocks no slot or globals names any more leave ``blocks``."""
    d = doc.data
    slots = (d.get("layers") or {}).get("slots") or {}
    if not slots or not isinstance(d.get("blocks"), list):
        return
    placed = {b for s in slots.values() if isinstance(s, dict) for b in s.get("blocks") or []}
    placed.add(d.get("globals"))
    keep = [b for b in d["blocks"] if b.get("block") in placed or b.get("block") in own_blocks]
    if len(keep) == len(d["blocks"]):
        return
    old = d["blocks"]
    moved = {old.index(b): j for j, b in enumerate(keep)}
    new_lines: dict[PathKey, int] = {}
    for p, line in doc.lines.items():
        if p[:1] == ("blocks",) and len(p) > 1:
            j = moved.get(int(p[1]))
            if j is not None:
                new_lines[("blocks", j, *p[2:])] = line
        else:
            new_lines[p] = line
    d["blocks"] = keep
    doc.lines.clear()
    doc.lines.update(new_lines)


def _added_symbols_used(
    merged: Located, base: Located, child: Located,
    block_symbols: Mapping[str, Iterable[str]], base_name: str,
) -> None:  # fmt: skip
    """A geometry symbol the child adds is bound by a block (by name or map), or read by an
    expression or name rule: otherwise it is a misspelt override of the base's."""
    added = set(child.data.get("geometry") or {}) - set(base.data.get("geometry") or {})
    if not added:
        return
    d = merged.data
    used: set[str] = set()
    for b in d.get("blocks") or []:
        syms = set(block_symbols.get(str(b.get("block")), ()))
        mapped = b.get("symbols") or {}
        used |= {str(g) for g in mapped.values()} | (syms - set(mapped))
    texts = [str(g.get(k)) for g in (d.get("geometry") or {}).values() if isinstance(g, dict)
             for k in ("default", "expr") if g.get(k) is not None]  # fmt: skip
    texts += [str(s) for r in d.get("names") or [] for s in r.get("sections") or []]
    texts += [str(c.get("check")) for c in d.get("constraints") or []]
    for name in sorted(added):
        if name in used or any(_mentions(t, name) for t in texts):
            continue
        raise child.error(
            ("geometry", name),
            f"{name} is not a symbol of {base_name}, and no block, name rule or expression "
            f"uses it (an override names one of {base_name}'s symbols: "
            f"{', '.join(sorted(base.data.get('geometry') or {}))})",
        )


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text) is not None
