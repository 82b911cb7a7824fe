"""The ``--out`` format's metadata: one typed record, ``BoundMeta``, encoded and decoded here only.

A rank's bound file (``bind --out``, and each ``rank-*.safetensors`` of ``--out-dir``) is a
safetensors file; tensors are named ``layers.{i}.{slot}.{field}`` and ``globals.{field}``, and
its ``__metadata__`` (string to string) holds the fields of ``BoundMeta``:
- ``model``, ``specs_sha256``: the model table and the hash of the specs that generated it;
- ``tp_size``, ``tp_rank``, ``ep_size``, ``ep_rank``: ASCII decimal, each rank below its size;
- ``geometry`` (every symbol) and ``overrides`` (the ``--set`` ones): JSON objects of integers;
- ``layers``: JSON ``{"<index>": {"role": "decoder"|"mtp", "slots": {slot: block}}}``;
- ``tensors``: how many tensors the bind wrote (a reload refuses a file missing one);
- ``padding`` (only where a vocabulary tp does not divide is padded): JSON
  ``{"<block>.<tensor>": [stored rows, padded rows]}`` (``ModelTable.padding``);
- ``quant`` (a quantized bind only): JSON ``{"outputs": [...], "scheme": s, "weight_only": b}``;
- ``world``, ``rank`` (``--out-dir`` only): the process-group place of the rank;
- ``digests``: JSON ``{"algorithm": "xxh3_128", "tensors": {name: hex}}``, each tensor's
  content digest (see Digests below), and ``record_digest``: the digest of every other key
  here, so an edited rank, geometry or count is seen. Computed by ``encode``, never stored.

Written by ``stream_out.StreamWriter`` (``encode``) and read by ``reload.read_bound``
(``decode``), nowhere else. ``decode`` checks what the file alone can say — each field there,
well-formed and in range — and refuses anything else with one ``ReloadError`` line naming the
file and the field; what only a model table can confirm (geometry symbols, slot blocks, the
scheme) is ``reload``'s.
Invariants: ``decode(encode(m)) == m``; ``encode`` is deterministic (sorted JSON keys, one
spelling of each number), so two binds give byte-identical headers.
Extending: a new key is a new field defaulting to None (older files lack it), added to
``encode`` and ``decode`` and nowhere else. The header is written after the data, so a value
known only once every byte is out (``tensors``, ``digests``) is a field like any other; the
writer's header reservation must bound its size before the first byte (``StreamWriter.start``).
Trap: files written before ``tensors``, ``overrides``, ``world``/``rank`` or ``digests``
existed lack them; those decode to None (``{}`` for overrides), never to a refusal here
(``reload`` refuses a file without digests, asking for a new bind).

Digests: one per tensor, and one of the whole metadata record.

- A tensor's digest is XXH3-128 over ``name``, ``dtype`` and ``shape`` (one ASCII line) and
  then its bytes, so a changed byte, two same-shape fields swapped, or a tensor re-saved under
  another name or shape each change it. ``StreamWriter`` feeds each tensor's bytes to the hash
  as it writes them (no second read of the file); a reload hashes exactly the bytes it hands
  out, so a rank that reads some tensors verifies only those.
- The record digest is XXH3-128 over the file's ``__metadata__`` strings (sorted, JSON) except
  itself: the ranks, geometry, layers, counts and the per-tensor digests. A forged
  ``tp_rank``, an edited ``layers`` or ``tensors`` all change it.

What this detects: corruption and accidental edits (a copy cut short, a tool that re-saves a
tensor, a hand-edited header). Not a deliberate forger: anyone can recompute an XXH3 digest;
there is no key. Measured at ~6 GB/s on one core (BENCHMARKS.md, "Issue #22: reload
digests").
Invariant: one algorithm, named ``ALGORITHM`` in the record; a file naming another is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import xxhash

from specbind.core.errors import ReloadError
from specbind.core.patterns import is_index
from specbind.core.planning import Ranks
from specbind.core.record import field, record
from specbind.runtime.binder.quant import OUTPUTS, quant_metadata

ALGORITHM = "xxh3_128"
HEX = 32  # characters of one digest
RECORD_KEY = "record_digest"  # the metadata key of the record digest, left out of its own hash


def tensor_hasher(name: str, dtype: str, shape: tuple[int, ...] | list[int]) -> xxhash.xxh3_128:
    """A hash already fed one tensor's identity; feed it the tensor's bytes, in file order."""
    h = xxhash.xxh3_128()
    h.update(f"{name}\0{dtype}\0{','.join(str(int(d)) for d in shape)}\n".encode())
    return h


def tensor_digest(
    name: str, dtype: str, shape: tuple[int, ...] | list[int], data: memoryview | bytes
) -> str:
    h = tensor_hasher(name, dtype, shape)
    h.update(data)
    return h.hexdigest()


def record_digest(meta: Mapping[str, str]) -> str:
    """The digest of a ``__metadata__`` mapping, every key but ``RECORD_KEY``."""
    rest = {k: v for k, v in meta.items() if k != RECORD_KEY}
    text = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return xxhash.xxh3_128(text.encode()).hexdigest()


def is_digest(text: object) -> bool:
    return isinstance(text, str) and len(text) == HEX and all(c in "0123456789abcdef" for c in text)


ROLES = ("decoder", "mtp")
NEEDED = ("model", "specs_sha256", "tp_size", "tp_rank", "ep_size", "ep_rank", "geometry",
          "layers")  # fmt: skip

Layers = Mapping[int, tuple[str, Mapping[str, str]]]  # index -> (role, slot -> block)


@record
class QuantMeta:
    """What a quantized bind records: the scheme, weight-only or not, the optional layouts."""

    scheme: str
    weight_only: bool
    outputs: tuple[str, ...] = ()  # of quant.OUTPUTS, sorted
    params: tuple[tuple[str, int], ...] = ()  # a scheme the config sets: G -> 128
    symmetric: bool = False

    def encode(self) -> str:
        return quant_metadata(
            self.scheme, self.weight_only, self.outputs, self.params, self.symmetric
        )


@record
class BoundMeta:
    """The metadata of one rank's bound file (the module docstring lists the keys)."""

    model: str
    specs_sha256: str
    ranks: Ranks
    geometry: Mapping[str, int]
    overrides: Mapping[str, int] = field(default_factory=dict)
    layers: Layers = field(default_factory=dict)
    tensors: int | None = None
    quant: QuantMeta | None = None
    world: int | None = None
    rank: int | None = None
    digests: Mapping[str, str] | None = None  # tensor name -> its content digest
    # "<block>.<tensor>" -> [stored rows, padded rows]: a vocabulary tp does not divide
    # (``ModelTable.padding``); empty, and no key written, when nothing is padded
    padding: Mapping[str, list[int]] = field(default_factory=dict)

    def encode(self) -> dict[str, str]:
        """The ``__metadata__`` strings, sorted by key."""
        r = self.ranks
        layers = {str(i): {"role": role, "slots": dict(s)} for i, (role, s) in self.layers.items()}
        meta = {
            "model": self.model,
            "specs_sha256": self.specs_sha256,
            "tp_size": str(r.tp_size),
            "tp_rank": str(r.tp_rank),
            "ep_size": str(r.ep_size),
            "ep_rank": str(r.ep_rank),
            "geometry": json.dumps(dict(self.geometry), sort_keys=True),
            "overrides": json.dumps(dict(self.overrides), sort_keys=True),
            "layers": json.dumps(layers, sort_keys=True),
        }
        optional = {"tensors": self.tensors, "world": self.world, "rank": self.rank}
        meta |= {k: str(v) for k, v in optional.items() if v is not None}
        if self.quant is not None:
            meta["quant"] = self.quant.encode()
        if self.padding:
            meta["padding"] = json.dumps(dict(self.padding), sort_keys=True)
        if self.digests is not None:
            doc = {"algorithm": ALGORITHM, "tensors": dict(self.digests)}
            meta["digests"] = json.dumps(doc, sort_keys=True)
            meta[RECORD_KEY] = record_digest(meta)
        return dict(sorted(meta.items()))


def decode(meta: Mapping[str, str], where: str) -> BoundMeta:
    """The record in a file's ``__metadata__``, or a ``ReloadError`` naming ``where`` and the
    first field that is missing or malformed."""
    missing = [k for k in NEEDED if k not in meta]
    if missing:
        raise ReloadError(
            f"{where}: not a specbind --out file (its metadata lacks {', '.join(missing)})"
        )
    d = _Decoder(meta, where)
    world, rank = d.count("world"), d.count("rank")
    if world is not None and (rank is None or rank >= world):
        raise ReloadError(f"{where}: metadata names rank {rank} of a world of {world}")
    return BoundMeta(
        model=meta["model"],
        specs_sha256=meta["specs_sha256"],
        ranks=d.ranks(),
        geometry=d.integers("geometry"),
        overrides=d.integers("overrides") if "overrides" in meta else {},
        layers=d.layers(),
        tensors=d.count("tensors"),
        quant=d.quant(),
        world=world,
        rank=rank,
        digests=d.digests(),
        padding=d.padding(),
    )


def quant_of(text: str | None, where: str) -> QuantMeta | None:
    """The ``quant`` value decoded (None for a bind that is not quantized)."""
    return None if text is None else _Decoder({"quant": text}, where).quant()


def is_count(text: str) -> bool:
    """A non-negative integer in ASCII digits (``str.isdigit`` also takes '²'), at most 18 of
    them (``int()`` refuses a text of over 4,300 digits with a ValueError of its own)."""
    return text.isascii() and text.isdecimal() and len(text) <= 18


@record
class _Decoder:
    meta: Mapping[str, str]
    where: str

    def fail(self, why: str) -> ReloadError:
        return ReloadError(f"{self.where}: {why}")

    def count(self, key: str) -> int | None:
        if key not in self.meta:
            return None
        if not is_count(self.meta[key]):
            text = self.meta[key]
            shown = text if len(text) <= 40 else text[:40] + "…"
            raise self.fail(f"metadata {key}={shown!r} is not a count")
        return int(self.meta[key])

    def ranks(self) -> Ranks:
        vals = {k: self.count(k) for k in ("tp_size", "tp_rank", "ep_size", "ep_rank")}
        tp_size, tp_rank, ep_size, ep_rank = (int(v or 0) for v in vals.values())
        if not (tp_rank < tp_size and ep_rank < ep_size):
            raise self.fail(
                f"metadata names tp rank {tp_rank} of {tp_size}, ep rank {ep_rank} of {ep_size}"
            )
        return Ranks(tp_size, tp_rank, ep_size, ep_rank)

    def json(self, key: str) -> Any:
        """The value as JSON, or None for a bad document."""
        try:
            return json.loads(self.meta[key])
        except (ValueError, RecursionError):  # RecursionError: nested past the limit
            return None

    def integers(self, key: str) -> dict[str, int]:
        doc = self.json(key)
        if not isinstance(doc, dict) or not all(type(v) is int for v in doc.values()):
            raise self.fail(f"metadata {key} is not an object of integers")
        return doc

    def layers(self) -> dict[int, tuple[str, Mapping[str, str]]]:
        doc = self.json("layers")
        if not isinstance(doc, dict):
            raise self.fail("metadata layers is not an object")
        out: dict[int, tuple[str, Mapping[str, str]]] = {}
        for key, x in doc.items():
            slots = x.get("slots") if isinstance(x, dict) else None
            if not is_index(key) or not isinstance(slots, dict):  # the layer digit rule
                raise self.fail(f"metadata layers[{key!r}] is not a layer")
            if not all(isinstance(b, str) for b in slots.values()):
                raise self.fail(f"metadata layers[{key!r}] names a slot block that is not a name")
            if x.get("role") not in ROLES:
                raise self.fail(f"metadata layers[{key!r}] has role {x.get('role')!r}, not one "
                                f"of {list(ROLES)}")  # fmt: skip
            out[int(key)] = (x["role"], dict(slots))
        return out

    def quant(self) -> QuantMeta | None:
        if "quant" not in self.meta:
            return None
        doc = self.json("quant")
        if doc is None:
            raise self.fail("metadata quant is not JSON")
        scheme = doc.get("scheme") if isinstance(doc, dict) else None
        if not isinstance(scheme, str):
            raise self.fail(f"metadata quant names no scheme (scheme {scheme!r})")
        outputs = doc.get("outputs", [])
        if not isinstance(outputs, list) or not all(o in OUTPUTS for o in outputs):
            raise self.fail(f"metadata quant outputs {outputs!r}: not a list of {list(OUTPUTS)}")
        if len(set(outputs)) != len(outputs):
            raise self.fail(f"metadata quant outputs {outputs!r} name an output twice")
        weight_only = doc.get("weight_only", False)
        if type(weight_only) is not bool:
            raise self.fail(f"metadata quant weight_only {weight_only!r} is not true or false")
        params = doc.get("params", {})
        if not isinstance(params, dict) or not all(
            isinstance(k, str) and type(v) is int and v >= 1 for k, v in params.items()
        ):
            raise self.fail(f"metadata quant params {params!r}: not names of whole numbers")
        sym = doc.get("symmetric", False)
        if type(sym) is not bool:
            raise self.fail(f"metadata quant symmetric {sym!r} is not true or false")
        return QuantMeta(
            scheme, weight_only, tuple(sorted(outputs)), tuple(sorted(params.items())), sym
        )

    def padding(self) -> dict[str, list[int]]:
        """``padding``: ``{"<block>.<tensor>": [stored rows, padded rows]}``, each padded
        size at least the stored one; absent: nothing padded."""
        if "padding" not in self.meta:
            return {}
        raw = self.json("padding")
        ok = isinstance(raw, dict) and all(
            isinstance(v, list) and len(v) == 2
            and all(type(x) is int for x in v) and 0 < v[0] <= v[1]
            for v in raw.values()
        )  # fmt: skip
        if not ok:
            raise self.fail("padding is not {tensor: [stored rows, padded rows]}")
        return {str(k): list(v) for k, v in raw.items()}

    def digests(self) -> dict[str, str] | None:
        if "digests" not in self.meta:
            return None
        doc = self.json("digests")
        algorithm = doc.get("algorithm") if isinstance(doc, dict) else None
        if algorithm != ALGORITHM:
            raise self.fail(f"metadata digests name algorithm {algorithm!r}, not {ALGORITHM!r}")
        tensors = doc.get("tensors") if isinstance(doc, dict) else None
        if not isinstance(tensors, dict) or not all(is_digest(v) for v in tensors.values()):
            raise self.fail("metadata digests is not an object of 32-digit hex digests")
        if not is_digest(self.meta.get(RECORD_KEY)):
            raise self.fail(f"metadata {RECORD_KEY} is missing or not a 32-digit hex digest")
        return dict(tensors)
