"""Which quantization scheme a checkpoint uses, and which of its linear modules it quantized,
read from the checkpoint's own config files and cross-checked against the tensors present.

A scheme (``specs/schemes/*.yaml``) says which config field announces it; at most one scheme
may claim a checkpoint. Which modules are quantized comes from the config, never from guessing
by dtype:
- ``glob`` (ModelOpt ``hf_quant_config.json`` ``quantization.exclude_modules``): a module is
  quantized unless its full name matches one of the patterns (``*`` wildcards, as fnmatch, case
  sensitive);
- ``compressed_tensors`` (``quantization_config.ignore`` and ``config_groups.*.targets``): a
  module is quantized when a target matches it (``Linear``: every linear; ``re:`` a regex
  matched from the start of the name, as compressed-tensors matches; else the exact name) and
  no ``ignore`` entry does;
- ``glob_prefix`` (gpt-oss's MXFP4 ``quantization_config.modules_to_not_convert``): as
  ``glob``, and a module under a listed one is excluded too (``model.layers.*.self_attn``
  excludes ``model.layers.0.self_attn.q_proj``), as transformers reads the list.
The patterns are untrusted: each field is compiled once by ``core.config_patterns`` into one
linear-time matcher, under caps on count and size (never Python's backtracking ``re``).

Invariants: a config that announces quantization no scheme describes is refused (a
``quantization_config`` with an unknown method is never bound as if it were BF16); an excluded
module that carries a scheme companion is refused naming the module; a malformed field is
refused naming the file and field.
Trap: the names matched are the checkpoint's own full module names (before any declared name
map), because that is what the tools wrote into their configs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specbind.core.config_patterns import Kind, NameMatcher
from specbind.core.errors import CheckpointError
from specbind.core.quant import DetectRule, SchemeRule, canonical
from specbind.core.quant_describe import describe
from specbind.core.record import field, record
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.layout.config import quantization_config


def lookup(doc: Any, dotted: str) -> list[Any]:
    """Every value at ``dotted`` in ``doc`` (``*`` is every key of an object); [] if none."""
    found = [doc]
    for part in dotted.split("."):
        nxt: list[Any] = []
        for d in found:
            if not isinstance(d, dict):
                continue
            if part == "*":
                nxt += list(d.values())
            elif part in d:
                nxt.append(d[part])
        found = nxt
    return found


@record
class QuantConfig:
    """One checkpoint's quantization: the scheme, and what the config says is quantized."""

    scheme: SchemeRule
    weight_only: bool
    excluded: tuple[str, ...]  # patterns or names, as the config writes them
    targets: tuple[str, ...]  # compressed-tensors targets; () for a glob scheme
    source: str  # "hf_quant_config.json quantization.exclude_modules", for messages
    targets_source: str = "config.json"  # where the targets are, for messages
    declared: str = ""  # where the config declares it: "config.json quantization_config"
    variant: str = ""  # that declaration in words (``core.quant_describe``)
    _exclude: NameMatcher = field(init=False, repr=False, compare=False)
    _targets: NameMatcher = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Both fields checked and compiled once, here: a bad or costly pattern is refused
        before any module is matched."""
        glob = self.scheme.exclude_match in ("glob", "glob_prefix")
        kind: Kind = "glob" if glob else "compressed_tensors"
        object.__setattr__(self, "_exclude", NameMatcher(self.excluded, kind, self.source))
        targets = [t for t in self.targets if t != "Linear"]
        object.__setattr__(
            self, "_targets", NameMatcher(targets, "compressed_tensors", self.targets_source)
        )

    def quantized(self, module: str, aliases: Sequence[str] = ()) -> bool:
        """True when the config says the module (full checkpoint name, or one of its
        ``aliases``: the tool's own module names, which its config lists) is quantized."""
        names = self._scoped([module, *aliases])
        if self._exclude.any(names):
            return False
        if self.scheme.exclude_match in ("glob", "glob_prefix") or "Linear" in self.targets:
            return True
        return self._targets.any(names)

    def _scoped(self, names: list[str]) -> list[str]:
        """``glob_prefix``: each name and every module it is under (a listed module excludes
        what it holds); otherwise the names as given."""
        if self.scheme.exclude_match != "glob_prefix":
            return names
        out = []
        for n in names:
            parts = n.split(".")
            out += [".".join(parts[:k]) for k in range(len(parts), 0, -1)]
        return out

    def why_excluded(self, module: str) -> str:
        hit = next((h for n in self._scoped([module]) if (h := self._exclude.first(n))), None)
        if hit is not None:
            return f"{self.source} lists {hit!r}"
        return f"no target of {self.scheme.exclude.file} config_groups matches it"


# Where a quantization is announced when config.json has no ``quantization_config``: the
# side files vLLM's ``get_quant_config`` reads (``weight_utils.py``), from each method's
# ``get_config_filenames``: ModelOpt ``hf_quant_config.json`` (``modelopt.py``), GPTQ
# ``quantize_config.json`` (``auto_gptq.py``), AWQ ``quant_config.json`` (``auto_awq.py``).
SIDE_FILES = ("hf_quant_config.json", "quantize_config.json", "quant_config.json")


def _read(ckpt: CheckpointDir, file: str, cache: dict[str, Any]) -> Any:
    if file not in cache:
        cache[file] = ckpt.config if file == "config.json" else ckpt.side_file(file)
    return cache[file]


def _holds(doc: Any, rule: DetectRule) -> bool:
    """Some value at the rule's field is one of its values (a scheme family's announcement)."""
    return any(canonical(v) in rule.values for v in lookup(doc, rule.field))


def _every(doc: Any, rule: DetectRule) -> bool:
    """Every value at the rule's field is one of its values; an absent field reads as null
    (a variant: ``strategy: channel`` in every config group)."""
    return all(canonical(v) in rule.values for v in lookup(doc, rule.field) or [None])


def _strings(doc: Any, file: str, field: str) -> tuple[str, ...]:
    out: list[str] = []
    for v in lookup(doc, field):
        if v is None:
            continue
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise CheckpointError(f"{file}: {field} is {v!r}, expected a list of strings")
        out += v
    return tuple(out)


def announced(ckpt: CheckpointDir, cache: dict[str, Any] | None = None) -> tuple[str, Any] | None:
    """(where, the document) of the quantization the checkpoint announces, as vLLM looks for
    it: config.json's ``quantization_config`` (or ``compression_config``), else the first side
    file present; None when it announces none."""
    cache = {} if cache is None else cache
    qc = quantization_config(ckpt.config)
    if qc is None and ckpt.config.get("compression_config") is not None:
        return "config.json compression_config", ckpt.config["compression_config"]
    if qc is not None:
        return "config.json quantization_config", qc
    for f in SIDE_FILES:
        doc = _read(ckpt, f, cache)
        if doc is not None:
            return f, doc
    return None


def detect(ckpt: CheckpointDir, schemes: Sequence[SchemeRule]) -> QuantConfig | None:
    """The checkpoint's quantization, or None for an unquantized checkpoint.

    A scheme matches when its ``detect`` field says its family and every ``variant`` rule
    holds; a family's other variant, or a method no scheme names, is refused in words
    (``core.quant_describe``), never read as another variant or as unquantized."""
    cache: dict[str, Any] = {}
    family = [s for s in schemes if _holds(_read(ckpt, s.detect.file, cache), s.detect)]
    hits = [s for s in family if all(_every(_read(ckpt, v.file, cache), v) for v in s.variant)]
    if len(hits) > 1:
        raise CheckpointError(
            f"{ckpt.root}: the config matches more than one quantization scheme "
            f"({', '.join(s.name for s in hits)}); refusing to guess"
        )
    if not hits:
        said = announced(ckpt, cache)
        if said is None and not family:
            return None
        where, doc = said if said is not None else (
            family[0].detect.file, _read(ckpt, family[0].detect.file, cache)
        )  # fmt: skip
        known = family or schemes
        raise CheckpointError(
            f"{where}: {describe(doc)}: no scheme in specs/schemes describes it (those there: "
            f"{', '.join(s.name for s in known)}); a quantized checkpoint is never bound as "
            "another variant or as unquantized"
        )
    s = hits[0]
    if s.params or s.symmetric:
        sym = any(_holds(_read(ckpt, w.file, cache), w) for w in s.symmetric)
        s = s.resolved(_params(_read(ckpt, s.detect.file, cache), s), sym)
    doc = _read(ckpt, s.exclude.file, cache)
    weight_only = any(_holds(_read(ckpt, w.file, cache), w) for w in s.weight_only)
    targets = (
        _strings(_read(ckpt, "config.json", cache), "config.json", s.targets) if s.targets else ()
    )
    where, said = announced(ckpt, cache) or (s.detect.file, _read(ckpt, s.detect.file, cache))
    return QuantConfig(
        scheme=s,
        weight_only=weight_only,
        excluded=_strings(doc, s.exclude.file, s.exclude.field),
        targets=targets,
        source=f"{s.exclude.file} {s.exclude.field}",
        targets_source=f"config.json {s.targets}",
        declared=where,
        variant=describe(said),
    )


MAX_PARAM = 1 << 20  # a group of a million columns: past any real checkpoint's


def _params(doc: Any, s: SchemeRule) -> dict[str, int]:
    """Each scheme param's value in the config (``G``: the group size): one whole number,
    the same in every config group, or refused naming the field."""
    out: dict[str, int] = {}
    for name, dotted in s.params:
        found = {canonical(v) for v in lookup(doc, dotted)}
        vals = [v for v in lookup(doc, dotted) if type(v) is int and 1 <= v <= MAX_PARAM]
        if len(found) != 1 or not vals:
            shown = ", ".join(sorted(found)) or "absent"
            raise CheckpointError(
                f"{s.detect.file}: {dotted} is {shown}; {s.name} reads {name} there as one "
                f"whole number from 1 to {MAX_PARAM}"
            )
        out[name] = vals[0]
    return out


def by_name(schemes: Sequence[SchemeRule]) -> Mapping[str, SchemeRule]:
    return {s.name: s for s in schemes}


def packed_names(q: QuantConfig | None) -> dict[str, str]:
    """The stored suffix of the packed weight -> ``weight``, when a scheme stores it under
    another name (compressed-tensors' ``weight_packed``)."""
    if q is None or q.scheme.weight.suffix == "weight":
        return {}
    return {q.scheme.weight.suffix: "weight"}
