"""The strict checks every generated binder runs.

Invariants (the claims of a hand-written strict binder, made once for every block):
- the census counts every name the block is given: names under the block prefix and the rest;
  a name under the prefix that the block does not declare is refused, all of them in one error;
- a family (``experts.{e}.…``) must hold every member ``0 <= e < count`` by name (an index by
  the digit rule of ``core.patterns``: ``experts.07.…`` is no member, it is unknown); a missing
  member is refused by name and an index past the end is refused, even on ranks that do not
  read it; a rank reads only its own members' bytes;
- an optional group (the DSA indexer) is all-or-nothing; a partial group is refused;
- a missing tensor names the layer and the tensor; a dtype mismatch says why; a shape or
  byte-count mismatch is refused; nothing is padded or truncated;
- an on-disk dtype the spec accepts as ``stored`` is converted exactly: a widening always, a
  narrowing only when every value survives, else the first value that would change is named;
- one verdict at every rank layout: a conversion that may change a value is checked on the
  whole tensor, not this rank's slice, so every tp rank refuses the same element (named in the
  whole tensor's coordinates) or none does. The extra read is bounded: only a tensor of at most
  ``WHOLE_CHECK_BYTES`` (4 MiB on disk) is read whole — a KDA conv is 64–128 KiB at real geometry —
  and it is counted in ``BindReport.verdict_bytes``, apart from ``bytes``; the rank's arrays
  still come from its own bytes. A bigger tensor is checked on this rank's slice only, and its
  refusal says so;
- a tied tensor (``tie``) is bound from its target when the config says so, and a stored copy
  is then refused;
- arrays are zero-copy views of the source bytes; only a cast, concat or stack allocates.
Trap: ``[n, 1, k]`` and ``[n, k]`` share their bytes, so a squeeze is shape-only and silent if
wrong; ``ops.concat_squeeze`` checks the squeezed dim really is 1.

How a refusal names a tensor (``Stored``, ``label``): by the name the checkpoint's own index
uses, in full. A binder reads tensors under the specs' names, layer-relative
(``mlp.experts.4.gate_proj.weight``); the checkpoint may store them otherwise
(``model.layers.3.block_sparse_moe.experts.4.w1.weight``, a name map's rename), as a row
section of a fused tensor (``self_attention.query_key_value.weight``), or as one member of a
stacked one (``block_sparse_moe.input_linear.weight``). A source that knows (``NamedView`` and
the layer and model-level sources over it) answers ``stored(name)`` with a ``Stored``:
- a label always begins with the full stored name; the spec's name follows only as
  ``read as <name>``, and only where it differs from the stored one;
- for a name the checkpoint lacks, ``stored`` gives the name it would be stored under (the
  renames its own names use, read backwards), so a "missing" refusal names what to look for;
- a source without ``stored`` (an in-memory ``DictSource``) names a tensor as it is given.
Trap: labels are built only when a refusal is raised; nothing of them runs on a bind that
succeeds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, SupportsInt

import numpy as np

from specbind.core.dtypes import DTYPES
from specbind.core.errors import BindError, GeometryError, at
from specbind.core.ir import ConstraintRule, FieldRule, GroupRule, TensorRule
from specbind.core.patterns import Matcher, fill, matcher
from specbind.core.planning import BlockPlan
from specbind.core.record import field, record, replace
from specbind.runtime.io.source import TensorSource, WholeSource

Array = np.ndarray[Any, np.dtype[Any]]  # numpy.typing.NDArray[Any], without importing it
# The largest stored tensor (on-disk bytes) a narrowing reads whole for its verdict; above it
# the check is this rank's slice only (see the module docstring).
WHOLE_CHECK_BYTES = 4 << 20


@record(frozen=False)
class BindReport:
    index: int
    kind: str  # the block
    bound: int = 0
    seen: int = 0  # names under the block prefix
    other: int = 0  # names the block was given outside its prefix
    bytes: int = 0  # this rank's bytes read from the checkpoint
    verdict_bytes: int = 0  # read beyond them for a whole-tensor or whole-layer verdict only
    slot: str = ""
    cast: list[str] = field(
        default_factory=list
    )  # tensors converted exactly from another stored dtype

    def as_dict(self) -> dict[str, Any]:
        return {
            "block": self.kind,
            "bound": self.bound,
            "seen": self.seen,
            "other": self.other,
            "bytes": self.bytes,
            "verdict_bytes": self.verdict_bytes,
            "cast": list(self.cast),
        }


@record
class Stored:
    """Where a name the specs use lies in the checkpoint."""

    name: str  # the full stored name (for an absent tensor: the name it would have)
    read_as: str | None = None  # the specs' name, where it differs from the stored one
    member: int | None = None  # its member of a stacked [members, ...] stored tensor
    row: int | None = None  # its first row in the stored tensor (or member): a row section
    shape: tuple[int, ...] | None = None  # the stored tensor's shape, for a section or member

    def label(self) -> str:
        """``model.layers.1.self_attn.qkv_proj.weight (its rows from 32 of [64, 32], read as
        self_attn.k_proj.weight)``; the stored name alone where nothing is renamed."""
        if self.read_as is None:
            return self.name
        where = [] if self.member is None else [f"member {self.member}"]
        if self.row is not None:
            where.append(f"its rows from {self.row}")
        if where and self.shape is not None:
            where[-1] += f" of {list(self.shape)}"
        return f"{self.name} ({', '.join([*where, f'read as {self.read_as}'])})"

    def index(self, local: Sequence[SupportsInt]) -> list[int]:
        """``local`` (an index of the tensor the specs read) in the stored tensor's
        coordinates: a section's first row added on axis 0, a member's index leading."""
        out = [int(i) for i in local]
        if self.row is not None and out:
            out[0] += self.row
        return out if self.member is None else [self.member, *out]


def stored(src: Any, name: str) -> Stored:
    """Where ``name`` of ``src`` lies in the checkpoint (as given when ``src`` cannot say)."""
    where = getattr(src, "stored", None)
    got = where(name) if where is not None else None
    return got if isinstance(got, Stored) else Stored(name)


def label(src: Any, name: str) -> str:
    """``name`` as a refusal words it: the stored tensor first (see ``Stored.label``)."""
    return stored(src, name).label()


def stored_name(src: Any, name: str) -> str:
    """``name``'s full stored name alone (see ``Stored.name``)."""
    return stored(src, name).name


def stored_names(src: Any, names: Iterable[str]) -> list[str]:
    """The stored names of ``names``, in order, each once (three sections of one fused tensor
    are one stored tensor): what a list in a refusal shows."""
    out: dict[str, None] = {}
    for n in names:
        out[stored(src, n).name] = None
    return list(out)


class UnrecognisedError(BindError):
    """Names under a block's prefix that it does not declare; ``names``: the specs' names
    (layer-relative), for a caller that knows which other block would declare them."""

    def __init__(self, names: Sequence[str], message: str) -> None:
        super().__init__(message)
        self.names = tuple(names)


def require(
    block: str, rule: ConstraintRule, values: Mapping[str, int], check: Callable[[], bool]
) -> None:
    """Evaluate one declared constraint; refuse, naming it and its ``why``, when it fails."""
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    try:
        ok = check()
    except GeometryError as e:  # e.g. H / tp with a remainder
        raise GeometryError(
            f"{block}: constraint {rule.name} ({rule.check}) cannot hold for {shown} ({e}): "
            f"{rule.why}"
        ) from None
    if not ok:
        raise GeometryError(
            f"{block}: constraint {rule.name} ({rule.check}) fails for {shown}: {rule.why}"
        )


def check_dims(block: str, shapes: Mapping[str, tuple[int, ...]]) -> None:
    for name, shape in shapes.items():
        if any(d < 1 for d in shape):
            raise GeometryError(
                f"{block}: {name} would have shape {list(shape)}; every dim must be >= 1"
            )


def family_matcher(rules: tuple[TensorRule, ...]) -> Matcher:
    """One matcher over the block's family patterns: a name's family and member index, by the
    digit rule of ``core.patterns`` (cached there, keyed by the patterns)."""
    return matcher(tuple(r.name for r in rules if r.family is not None))


def members(t: Mapping[str, Any], pattern: str, family: str, plan: BlockPlan) -> list[Any]:
    """This rank's arrays of one family pattern, in member order (what a stack reads)."""
    assert plan.members is not None
    return [t[fill(pattern, i)] for i in plan.members[family]]


@record(frozen=False)
class Census:
    """What a block's rules make of the names it is given (names only: nothing is read)."""

    present: set[str]  # every name given
    seen: int = 0  # names under the prefix
    other: int = 0  # names outside it
    found: dict[str, set[int]] = field(default_factory=dict)  # family pattern -> members
    unknown: list[str] = field(default_factory=list)  # under the prefix, declared by no rule
    beyond: list[tuple[str, int, str, int]] = field(default_factory=list)  # name, i, family, size

    def has(self, r: TensorRule) -> bool:
        return bool(self.found[r.name]) if r.family is not None else r.name in self.present

    def absent(self, r: TensorRule, counts: Mapping[str, int]) -> list[str]:
        """The names of ``r`` (every family member by name) that are not there."""
        if r.family is None:
            return [] if r.name in self.present else [r.name]
        have = self.found[r.name]
        return [r.concrete(i).name for i in range(counts[r.family]) if i not in have]


def census(
    rules: tuple[TensorRule, ...], names: Sequence[str], prefix: str, counts: Mapping[str, int]
) -> Census:
    """Sort ``names`` against the rules: declared tensors, family members (and those past the
    family's size), undeclared names under the prefix, names outside it."""
    literal = {r.name for r in rules if r.family is None}
    by_pattern = {r.name: r for r in rules if r.family is not None}
    families = family_matcher(rules)
    c = Census(set(names), found={p: set() for p in by_pattern})
    for n in names:
        if not n.startswith(prefix):
            c.other += 1
            continue
        c.seen += 1
        if n in literal:
            continue
        hit = families.match(n)
        if hit is None:
            c.unknown.append(n)
            continue
        pat, i = hit
        family = by_pattern[pat].family or ""
        if i < counts[family]:
            c.found[pat].add(i)
        else:
            c.beyond.append((n, i, family, counts[family]))
    c.unknown.sort()
    return c


def bind_tensors(
    block: str,
    layer: int,
    prefix: str,
    src: TensorSource,
    rules: tuple[TensorRule, ...],
    groups: Mapping[str, GroupRule],
    plan: BlockPlan,
    counts: Mapping[str, int],
    flags: Mapping[str, bool] | None = None,
) -> tuple[dict[str, Array], BindReport]:
    """Check a block's tensors against the rules and return this rank's arrays by name.

    ``src`` yields this rank's bytes (a ``ShardedSource``); ``counts`` holds each family's
    size; ``flags`` holds the config booleans a ``tie`` reads.
    """
    c = census(rules, src.names(), prefix, counts)
    rep = BindReport(index=layer, kind=block, seen=c.seen, other=c.other)
    for n, i, family, size in c.beyond[:1]:
        raise BindError(
            f"{at(layer)}: {label(src, n)}: index {i} is outside the family {family} in "
            f"range({size}) of a {block} block"
        )
    unknown = stored_names(src, c.unknown)
    if unknown:
        n_req = sum(1 for r in rules if r.group is None or not groups[r.group].optional)
        n_opt = len(rules) - n_req
        plus = f" (plus {n_opt} optional)" if n_opt else ""
        shown = unknown if len(unknown) <= 20 else [*unknown[:20], f"... {len(unknown) - 20} more"]
        raise UnrecognisedError(
            c.unknown,
            f"{at(layer)}: {len(unknown)} unrecognised {prefix.rstrip('.') or block} "
            f"tensor(s): {shown} — a {block} block has exactly {n_req}{plus} "
            "and this binder refuses to skip anything",
        )
    has = c.has
    present = c.present

    tied = {r.name for r in rules if r.tie is not None and (flags or {}).get(r.tie.config)}
    for g in groups.values():
        member_rules = [r for r in rules if r.group == g.name and r.name not in tied]
        have = [r.name for r in member_rules if has(r)]
        if g.optional and have and len(have) != len(member_rules):
            # the group's ``why`` is not quoted: a block's note may speak of the family it was
            # written for (Qwen3's q/k norms), and this checkpoint may be another's
            missing = stored_names(src, [r.name for r in member_rules if not has(r)])
            stored_ = stored_names(src, have)
            raise BindError(
                f"{at(layer)}: partial {g.name} group in a {block} block: missing {missing} "
                f"while {stored_} {'is' if len(stored_) == 1 else 'are'} stored — the group's "
                f"{len(member_rules)} tensors are stored all together or not at all"
            )
    wanted: list[TensorRule] = []
    for r in rules:
        if r.group is not None and groups[r.group].optional and not has(r):
            continue
        if r.name in tied:
            assert r.tie is not None
            if has(r):
                raise BindError(
                    f"{at(layer)}: {label(src, r.name)} is stored, but config.json "
                    f"{r.tie.config} is true: it must be bound from "
                    f"{stored(src, r.tie.to).name}, and a second copy would be ignored"
                )
            continue
        wanted.append(r)
    missing = stored_names(src, [n for r in wanted for n in c.absent(r, counts)])
    if missing:
        what = missing[0] if len(missing) == 1 else f"{len(missing)} tensors: {missing[:20]}"
        them = "it" if len(missing) == 1 else "them"
        raise BindError(f"{at(layer)}: missing {what} (a {block} block requires {them})")

    by_name = {r.name: r for r in rules}
    out: dict[str, Array] = {}
    for name, tp in plan.tensors.items():
        r = by_name[tp.pattern]
        if r.name in tied or not (r.family is not None or r.name in present):
            continue
        out[name] = check_one(block, layer, src, r, name, tp.local_shape, rep)
        rep.bound += 1
    for r in rules:
        if r.name in tied and r.tie is not None:
            if r.tie.to not in out:
                raise BindError(
                    f"{at(layer)}: {stored(src, r.name).name} is tied to "
                    f"{stored(src, r.tie.to).name}, which is absent"
                )
            out[r.name] = out[r.tie.to]  # the same bytes: both split by the same rule
    return out, rep


def check_one(
    block: str,
    layer: int,
    src: TensorSource,
    rule: TensorRule,
    name: str,
    want: tuple[int, ...],
    rep: BindReport,
) -> Array:
    """One tensor of ``src`` checked against ``rule`` at this rank's shape ``want``, converted
    exactly when stored in another accepted dtype; its bytes are counted in ``rep.bytes``."""
    t = src.get(name)
    if t is None:
        raise BindError(f"{at(layer)}: missing {label(src, name)} (a {block} block requires it)")
    if t.dtype != rule.dtype and t.dtype not in rule.stored:
        why = rule.why_dtype or (
            "the spec accepts no other stored dtype here (`stored:` lists the ones converted "
            "exactly), and nothing is cast behind your back"
        )
        also = f" (or {', '.join(rule.stored)}, converted exactly)" if rule.stored else ""
        raise BindError(
            f"{at(layer)}: {label(src, name)} is {t.dtype} but a {block} block requires "
            f"{rule.dtype}{also} — {why}"
        )
    if tuple(t.shape) != want:
        raise BindError(
            f"{at(layer)}: {label(src, name)} has shape {list(t.shape)}, expected "
            f"{list(want)} ({rule.shape})"
        )
    dt = DTYPES[t.dtype]
    expect = dt.nbytes(want)
    if len(t.data) != expect:
        raise BindError(
            f"{at(layer)}: {label(src, name)} is {len(t.data)} B, shape {list(want)} implies "
            f"{expect} B"
        )
    if dt.numpy is None:
        raise BindError(
            f"{at(layer)}: {label(src, name)} has dtype {t.dtype}, which has no array form"
        )
    rep.bytes += len(t.data)  # what this rank read from the file, at its on-disk width
    flat = np.frombuffer(t.data, dtype=dt.numpy)
    arr = flat.reshape(want)  # [prod(want)] -> want: the on-disk shape, zero-copy
    if t.dtype == rule.dtype:
        return arr
    rep.cast.append(f"{name}: {t.dtype} -> {rule.dtype}")
    return _converted(src, name, t.dtype, rule.dtype, arr, layer, rep)


def _converted(
    src: TensorSource,
    name: str,
    on_disk: str,
    dtype: str,
    arr: Array,
    layer: int,
    rep: BindReport,
) -> Array:
    """``arr`` (this rank's slice) converted exactly, the verdict taken on the whole tensor when
    the conversion may change a value and the whole is at most ``WHOLE_CHECK_BYTES``; a
    refusal names the element in the stored tensor's coordinates (``Stored.index``)."""
    np_dtype = DTYPES[dtype].numpy
    assert np_dtype is not None
    where = _Where(src, name, layer)
    if np.can_cast(arr.dtype, np_dtype, casting="safe"):
        return arr.astype(np_dtype)  # a widening: every value survives, on every rank
    full = src.whole(name) if isinstance(src, WholeSource) else None
    if full is None or len(full.data) == arr.nbytes:
        return exact_cast(arr, on_disk, dtype, where.what, where=where.at)  # read whole
    if len(full.data) > WHOLE_CHECK_BYTES:
        return exact_cast(
            arr, on_disk, dtype, where.what,
            f" (checked on this rank's slice only: the whole tensor's {len(full.data)} B is "
            f"over the {WHOLE_CHECK_BYTES} B bound of a whole-tensor check, so another rank "
            "may bind its slice)",
        )  # fmt: skip
    whole = np.frombuffer(full.data, dtype=arr.dtype).reshape(full.shape)
    exact_cast(whole, on_disk, dtype, where.what, where=where.at)  # the whole's coordinates
    rep.verdict_bytes += len(full.data) - arr.nbytes
    return arr.astype(np_dtype)  # exact: every value of the whole survives


class _Where:
    """A tensor's label and stored coordinates, asked for only when a conversion refuses."""

    def __init__(self, src: TensorSource, name: str, layer: int) -> None:
        self._src, self._name, self._layer = src, name, layer

    def what(self) -> str:
        return f"{at(self._layer)}: {label(self._src, self._name)}"

    def at(self) -> Stored:
        return stored(self._src, self._name)


def exact_cast(
    a: Array,
    stored: str,
    dtype: str,
    what: str | Callable[[], str],
    scope: str = "",
    where: Callable[[], Stored] | None = None,
) -> Array:
    """``a`` (on-disk dtype ``stored``) converted to ``dtype`` when every value survives the
    round trip; else refused, naming the first element that would change (``scope`` says
    which part of the tensor was checked; ``what`` names it, or is asked to when a value
    would change; ``where``: asked then where ``a`` lies in a fused or stacked stored tensor,
    so the element is named in the stored tensor's coordinates). NaN stays NaN and the sign
    of zero must survive."""
    np_dtype = DTYPES[dtype].numpy
    assert np_dtype is not None
    out = a.astype(np_dtype)
    back = out.astype(a.dtype)
    same = (back == a) & (np.signbit(back) == np.signbit(a))
    if a.dtype.kind == "f" or stored == "BF16":
        same |= np.isnan(back.astype(np.float32)) & np.isnan(a.astype(np.float32))
    if not bool(np.all(same)):
        bad = np.unravel_index(int(np.argmin(same)), a.shape)
        at_ = where().index(bad) if where is not None else [int(i) for i in bad]
        raise BindError(
            f"{what if isinstance(what, str) else what()} is stored as {stored}; converting it "
            f"to {dtype} would change element "
            f"{at_} from {float(a[bad])!r} to {float(back[bad])!r} — refused "
            f"(a conversion is exact or not done){scope}"
        )
    return out


# --- the checkpoint's own half dtype (config.choose decides which) ---------------------------
# Only the spec's BF16 tensors follow an F16 choice; a tensor the spec keeps in another dtype
# (an F32 A_log, a correction bias) keeps it, and its ``stored`` alternatives still convert
# exactly or are refused. Nothing converts between F16 and BF16: a BF16 tensor in a checkpoint
# bound as F16 (a mixed checkpoint) is refused naming the tensor, with why, never rounded.


def rules_in(
    rules: Sequence[TensorRule], plan: BlockPlan, half: str
) -> tuple[tuple[TensorRule, ...], BlockPlan]:
    """``rules`` and ``plan`` with every BF16 tensor bound as ``half`` instead."""
    if half == "BF16":
        return tuple(rules), plan
    why = (
        f"this checkpoint binds its half-precision tensors as {half}; a tensor in another "
        "half dtype would have to be rounded, so a mixed checkpoint is refused"
    )
    out = tuple(
        replace(r, dtype=half, stored=tuple(d for d in r.stored if d != half), why_dtype=why)
        if r.dtype == "BF16"
        else r
        for r in rules
    )
    tensors = {
        n: replace(t, dtype=half, stored=tuple(d for d in t.stored if d != half))
        if t.dtype == "BF16"
        else t
        for n, t in plan.tensors.items()
    }
    return out, replace(plan, tensors=tensors)


def fields_in(fields: Mapping[str, FieldRule], half: str) -> dict[str, FieldRule]:
    """The bound fields' rules with BF16 read as ``half``."""
    return {
        k: replace(f, dtype=half) if half != "BF16" and f.dtype == "BF16" else f
        for k, f in fields.items()
    }
