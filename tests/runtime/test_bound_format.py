"""The ``--out`` metadata record: what the writer encodes the reader decodes to the same record,
and a malformed field is refused in one line naming the file and the field."""

from __future__ import annotations

import pytest
from helpers import FULL_META as FULL

from specbind.core.errors import ReloadError
from specbind.runtime.bound.bound_format import BoundMeta, decode


def test_every_field_survives_encode_then_decode() -> None:
    meta = FULL.encode()
    assert all(isinstance(v, str) for v in meta.values()) and list(meta) == sorted(meta)
    assert decode(meta, "f") == FULL


def test_the_encoding_does_not_depend_on_the_order_of_a_records_mappings() -> None:
    other = BoundMeta(
        FULL.model, FULL.specs_sha256, FULL.ranks, {"experts": 8, "hidden": 72}, FULL.overrides,
        dict(reversed(list(FULL.layers.items()))), FULL.tensors, FULL.quant, FULL.world, FULL.rank,
        dict(reversed(list((FULL.digests or {}).items()))),
    )  # fmt: skip
    assert other.encode() == FULL.encode()


def test_a_file_written_before_the_newer_fields_decodes_them_as_absent() -> None:
    meta = {k: v for k, v in FULL.encode().items()
            if k not in ("tensors", "overrides", "world", "rank", "quant", "digests",
                         "record_digest")}  # fmt: skip
    got = decode(meta, "f")
    assert (got.tensors, got.overrides, got.world, got.rank, got.quant, got.digests) == (
        None, {}, None, None, None, None)  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("model", None, r"^f: not a specbind --out file \(its metadata lacks model\)$"),
        ("tp_rank", "2", r"^f: metadata names tp rank 2 of 2, ep rank 3 of 4$"),
        ("ep_size", "0", r"^f: metadata names tp rank 1 of 2, ep rank 3 of 0$"),
        ("tensors", "-1", r"^f: metadata tensors='-1' is not a count$"),
        ("rank", "8", r"^f: metadata names rank 8 of a world of 8$"),
        ("overrides", '{"kda_chunk": "16"}', r"^f: metadata overrides is not an object of integ"),
        ("geometry", "[]", r"^f: metadata geometry is not an object of integers$"),
        ("layers", '{"x": {"slots": {}}}', r"^f: metadata layers\['x'\] is not a layer$"),
        (
            "layers",
            '{"07": {"role": "decoder", "slots": {}}}',
            r"^f: metadata layers\['07'\] is not a layer$",
        ),
        (
            "layers",
            '{"\\u0663": {"role": "decoder", "slots": {}}}',
            r"^f: metadata layers\['٣'\] is not a layer$",
        ),
        ("layers", '{"0": {"role": "mtp", "slots": {"a": 3}}}', r"layers\['0'\] names a slot"),
        ("quant", "{", r"^f: metadata quant is not JSON$"),
        ("quant", '{"scheme": "s", "weight_only": 1}', r"quant weight_only 1 is not true or"),
    ],
)
def test_a_malformed_field_is_refused_in_one_line_naming_it(
    key: str, value: str | None, message: str
) -> None:
    meta = FULL.encode()
    if value is None:
        del meta[key]
    else:
        meta[key] = value
    with pytest.raises(ReloadError, match=message) as e:
        decode(meta, "f")
    assert "\n" not in str(e.value)
