"""Load a YAML spec safely and remember where every value sits, for errors that name the line.

Invariants:
- only ``yaml.SafeLoader`` constructs values (no ``!!python/*`` tags, no arbitrary objects);
- anchors and aliases are refused before construction, so an alias bomb ("billion laughs")
  never expands, and no node is shared between two paths;
- duplicate mapping keys are refused (PyYAML would silently keep the last one);
- the document must be a mapping with string keys.
Trap: a YAML error's ``problem_mark`` is 0-based; lines reported here are 1-based.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specbind.core.errors import SpecError

MAX_SPEC_BYTES = 1 << 20  # a spec is a page of text; 1 MiB is already absurd

PathKey = tuple[str | int, ...]


@dataclass
class Located:
    """A loaded document plus the 1-based line of every path inside it."""

    file: str
    data: Any
    lines: dict[PathKey, int] = field(default_factory=dict)

    def line(self, path: PathKey) -> int | None:
        """The line of ``path``, or of its nearest ancestor that has one."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.lines.get((), None)

    def error(self, path: PathKey, message: str) -> SpecError:
        return SpecError(self.file, format_path(path), self.line(path), message)


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


def format_path(path: PathKey) -> str:
    """``tensors.q_proj.weight.shape[1]``; an odd key is shown as a repr, never raw."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part[:64]!r}]"
    return out


def load(path: Path, display: str | None = None) -> Located:
    name = display or str(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise SpecError(name, "", None, f"cannot read: {e.strerror}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(name, "", None, f"spec is {len(raw)} bytes, over the {MAX_SPEC_BYTES} cap")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(name, "", None, f"not UTF-8 (byte {e.start})") from None
    return loads(text, name)


def loads(text: str, name: str) -> Located:
    try:
        _refuse_anchors(text, name)
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                raise SpecError(name, "", 1, "the file is empty; a spec must be a mapping")
            lines: dict[PathKey, int] = {}
            _walk(node, (), lines, name)
            data = loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        context = str(e.context or "")
        if e.context_mark is not None and e.problem_mark is not None and context:
            context += f" (from line {e.context_mark.line + 1})"
        msg = " ".join(x for x in (context, str(e.problem or "")) if x)
        raise SpecError(name, "", line, f"invalid YAML: {msg}") from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow
        line = text.count("\n", 0, e.position) + 1
        what = f"invalid YAML: character {e.character!r} is not allowed"
        raise SpecError(name, "", line, what) from None
    except yaml.YAMLError as e:
        raise SpecError(name, "", None, f"invalid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise SpecError(name, "", None, "YAML nested too deeply") from None
    if not isinstance(data, dict):
        line = lines.get((), 1)
        raise SpecError(name, "", line, f"a spec must be a mapping, not {type(data).__name__}")
    return Located(name, data, lines)


MAX_DEPTH = 32  # a spec is a few levels deep; deeper nesting is refused before composing


def _refuse_anchors(text: str, name: str) -> None:
    """One pass over the tokens: refuse anchors, aliases and absurd nesting, with the line."""
    depth = 0
    opens = (yaml.FlowSequenceStartToken, yaml.FlowMappingStartToken, yaml.BlockMappingStartToken,
             yaml.BlockSequenceStartToken)  # fmt: skip
    closes = (yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken, yaml.BlockEndToken)
    for tok in yaml.scan(text, Loader=yaml.SafeLoader):
        if isinstance(tok, opens):
            depth += 1
            if depth > MAX_DEPTH:
                line = tok.start_mark.line + 1
                raise SpecError(name, "", line, f"YAML nested too deeply (over {MAX_DEPTH} levels)")
        elif isinstance(tok, closes):
            depth -= 1
        if isinstance(tok, yaml.AnchorToken | yaml.AliasToken):
            kind = "anchor" if isinstance(tok, yaml.AnchorToken) else "alias"
            raise SpecError(
                name,
                "",
                tok.start_mark.line + 1,
                f"YAML {kind} '{tok.value}' is not allowed in specs (write each value out)",
            )


def _walk(
    node: yaml.Node, path: PathKey, lines: dict[PathKey, int], name: str, line: int | None = None
) -> None:
    """Record each path's line: a mapping entry's is the line of its key (where a reader looks)."""
    lines[path] = line if line is not None else node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            key_line = key.start_mark.line + 1
            if not isinstance(key, yaml.ScalarNode) or key.tag != "tag:yaml.org,2002:str":
                raise SpecError(name, format_path(path), key_line, "mapping keys must be strings")
            k = str(key.value)
            if k in seen:
                raise SpecError(
                    name,
                    format_path((*path, k)),
                    key_line,
                    f"duplicate key {k!r} (first at line {seen[k]})",
                )
            seen[k] = key_line
            _walk(value, (*path, k), lines, name, key_line)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, i), lines, name)
