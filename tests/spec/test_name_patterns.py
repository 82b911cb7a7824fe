"""The one digit rule of layer and member indices (``core.patterns``), and that every place
that reads a name agrees on it: a leading-zero, non-ASCII or too wide index is no layer and no
member anywhere, so bind and audit refuse it as an unknown or unclaimed tensor."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from budget import examples
from helpers import TABLE, TINY, copy_with, read_file
from hypothesis import given, settings
from hypothesis import strategies as st

from specbind.audit import audit
from specbind.core.errors import GeometryError, SpecbindError
from specbind.core.ir import ShardRule, TensorRule
from specbind.core.patterns import (
    MAX_DIGITS,
    MAX_INDEX,
    fill,
    index_of,
    is_index,
    layer_pattern,
    matcher,
    member_of,
    parts,
)
from specbind.generated import MODELS
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.bind.preamble import NamedView
from specbind.runtime.binder.checks import census
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.layout.slots import split_layers
from specbind.synth import synth, tiny_values

GOOD = ["0", "7", "10", "288", "999999"]
BAD = [
    "",  # empty
    "07",  # a leading zero: a second name of member 7
    "00",
    "1000000",  # past MAX_DIGITS
    "-1",  # a sign
    "+7",
    " 7",
    "7_0",  # int() takes the underscore
    "٣",  # Arabic-Indic three: int("٣") == 3
    "３",  # fullwidth three
    "²",  # "²".isdigit()
    "7\n",
    "0x1",
]
MEMBER = "mlp.experts.{e}.down_proj.weight"
RULES = (
    TensorRule(MEMBER, "BF16", "[X, Im]", ShardRule("replicated"), family="e"),
    TensorRule("mlp.gate.weight", "BF16", "[E, X]", ShardRule("replicated")),
)


@pytest.mark.parametrize("text", GOOD)
def test_an_index_is_ascii_digits_without_a_leading_zero(text: str) -> None:
    assert is_index(text)


@pytest.mark.parametrize("text", BAD, ids=ascii)
def test_a_leading_zero_sign_non_ascii_empty_or_too_wide_index_is_refused(text: str) -> None:
    assert not is_index(text)


def test_layer_and_member_indices_share_one_width() -> None:
    widest, past = str(MAX_INDEX), str(MAX_INDEX + 1)
    assert len(widest) == MAX_DIGITS
    assert index_of(MEMBER, fill(MEMBER, MAX_INDEX)) == MAX_INDEX
    assert index_of(MEMBER, MEMBER.replace("{e}", past)) is None
    layer = layer_pattern("layers.{index}.", "model.")
    assert layer.split(f"model.layers.{widest}.x") == (f"model.layers.{widest}.", MAX_INDEX, "x")
    assert layer.split(f"model.layers.{past}.x") is None


@given(st.text(alphabet="0123456789٠١٣５３²+-_ x\n", max_size=9))
def test_an_index_is_exactly_the_text_str_writes_of_an_int_in_range(text: str) -> None:
    try:
        canonical = str(int(text)) == text and 0 <= int(text) <= MAX_INDEX
    except ValueError:
        canonical = False
    assert is_index(text) == canonical


PATTERN_PARTS = st.from_regex(r"[a-z_][a-z0-9_]{0,6}(\.[a-z0-9_]{1,6}){0,2}\.", fullmatch=True)


@given(PATTERN_PARTS, st.sampled_from("efx"), st.sampled_from(["", "w", "up.weight"]),
       st.integers(0, MAX_INDEX))  # fmt: skip
def test_a_filled_pattern_matches_back_to_its_index(
    head: str, letter: str, tail: str, index: int
) -> None:
    pattern = head + "{" + letter + "}" + ("." + tail if tail else "")
    name = fill(pattern, index)
    assert index_of(pattern, name) == index and member_of(name, pattern)
    other = head + "{" + letter + "}.other"
    assert matcher((other, pattern)).match(name) == (pattern, index)


@given(st.sampled_from(["", "model.", "language_model.model."]), st.integers(0, MAX_INDEX),
       st.from_regex(r"[a-z_][a-z0-9_.]{0,20}", fullmatch=True))  # fmt: skip
def test_a_layer_name_splits_back_into_its_prefix_index_and_rest(
    prefix: str, index: int, rest: str
) -> None:
    lp = layer_pattern("layers.{index}.", prefix)
    assert lp.split(lp.format(index) + rest) == (lp.format(index), index, rest)
    anywhere = layer_pattern("layers.{index}.")
    assert anywhere.split(lp.format(index) + rest) == (lp.format(index), index, rest)


def test_the_first_pattern_in_order_wins_in_a_combined_matcher() -> None:
    assert matcher(("a.{e}.w", "a.{f}.w")).match("a.3.w") == ("a.{e}.w", 3)
    assert matcher(("a.{f}.w", "a.{e}.w")).match("a.3.w") == ("a.{f}.w", 3)
    assert matcher(()).match("a.3.w") is None


def test_a_trailing_newline_is_part_of_the_name_not_dropped() -> None:
    lp = layer_pattern("layers.{index}.", "")
    assert lp.split("layers.3.x\n") == ("layers.3.", 3, "x\n")
    assert index_of(MEMBER, fill(MEMBER, 3) + "\n") is None


def test_a_pattern_without_a_placeholder_names_one_tensor() -> None:
    assert fill("mlp.gate.weight", 7) == "mlp.gate.weight"
    assert member_of("mlp.gate.weight", "mlp.gate.weight")
    assert not member_of("mlp.gate.weight2", "mlp.gate.weight")


def test_an_index_past_the_width_cannot_be_formatted() -> None:
    with pytest.raises(GeometryError, match=r"mlp\.experts\.\{e\}.*index 1000000 is outside"):
        fill(MEMBER, MAX_INDEX + 1)
    with pytest.raises(GeometryError, match="index -1 is outside"):
        fill(MEMBER, -1)


def test_a_pattern_with_two_placeholders_is_refused() -> None:
    with pytest.raises(ValueError, match="more than one placeholder"):
        parts("a.{e}.b.{f}")


@pytest.mark.parametrize("text", GOOD + BAD, ids=ascii)
def test_every_reader_of_names_agrees_on_the_rule(text: str) -> None:
    """Members: ``member_of`` (quant, synth --quant), the census (bind, audit, layout); layers:
    the layer split (bind, audit, plan) and the named view (renames); all say the same."""
    ok = is_index(text)
    member = MEMBER.replace("{e}", text)
    assert member_of(member, MEMBER) == ok
    c = census(RULES, [member, "mlp.gate.weight"], "mlp.", {"e": MAX_INDEX + 1})
    assert (c.unknown == []) == ok and c.found[MEMBER] == ({int(text)} if ok else set())
    layer = f"layers.{text}.mlp.gate.weight"
    split = split_layers(TABLE, [layer])
    assert split.layers == ({int(text): ["mlp.gate.weight"]} if ok else {})
    assert split.outside == ([] if ok else [layer])
    assert (layer_pattern(TABLE.layer_pattern).split(f"model.layers.{text}.x") is not None) == ok


_PIECES = ["", "model.", "language_model.", "layers.", "0", "3", "07", "12", ".", "mlp.w", "x"]


@settings(max_examples=examples(2))
@given(
    st.lists(st.lists(st.sampled_from(_PIECES), max_size=7).map("".join), max_size=12),
    st.sampled_from([(), ("layers.3.",)]),
)
def test_the_layer_split_reads_each_name_as_its_prefixs_own_pattern_does(
    names: list[str], extra: tuple[str, ...]
) -> None:
    """The split matches every allowed prefix with one regex when no name can match two
    (``extra``: a prefix that starts with another's layer head forces the per-prefix path); both
    must agree with ``LayerPattern.split`` under each prefix, ambiguity refused alike."""
    table = replace(TABLE, layer_prefixes=(*TABLE.layer_prefixes, *extra))
    hits = {
        p: [(n, h) for n in names if (h := layer_pattern(table.layer_pattern, p).split(n))]
        for p in table.layer_prefixes
    }
    used = [p for p, h in hits.items() if h]
    if len(used) > 1:
        with pytest.raises(SpecbindError, match="more than one prefix"):
            split_layers(table, names)
        return
    split = split_layers(table, names)
    prefix = used[0] if used else table.layer_prefixes[0]
    assert split.prefix == prefix
    want: dict[int, list[str]] = {}
    for _, (_, index, rest) in hits[prefix]:
        want.setdefault(index, []).append(rest)
    assert split.layers == dict(sorted(want.items()))
    inside = {n for n, _ in hits[prefix]}
    assert split.outside == [n for n in names if n not in inside]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("names") / "ck"
    synth(TABLE, d, dict(TINY), layers=4, seed=1, mtp=False)
    return d


def _tensors(ckpt: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        out |= read_file(f)
    return out


MEMBER_CASES = [
    ("experts.5.", "experts.05."),  # a leading zero
    ("experts.5.", "experts.٥."),  # Arabic-Indic five
    ("experts.5.", "experts.５."),  # fullwidth five
    ("experts.5.", "experts.1000000."),  # past the width
]
LAYER_CASES = [("layers.3.", "layers.03."), ("layers.3.", "layers.٣."), ("layers.3.", "layers.３.")]


@pytest.mark.parametrize(("good", "bad"), MEMBER_CASES, ids=ascii)
def test_an_extra_member_off_the_rule_is_refused_as_unknown_by_bind_and_audit(
    tiny: Path, tmp_path: Path, good: str, bad: str
) -> None:
    src = "layers.3.mlp.experts.5.down_proj.weight"
    t = _tensors(tiny)
    d = copy_with(tiny, tmp_path / "ck", {src.replace(good, bad): t[src]})
    full = src.replace(good, bad)  # named as the checkpoint stores it, in full
    with pytest.raises(SpecbindError) as e:
        bind_checkpoint(CheckpointDir(d), TABLE, progress=False)
    assert str(e.value).startswith(f"layer 3: 1 unrecognised mlp tensor(s): [{full!r}]")
    assert audit(CheckpointDir(d), TABLE, progress=False)["problems"] == [
        f"layer 3: mlp (moe): 1 undeclared: [{full!r}]"
    ]


@pytest.mark.parametrize(("good", "bad"), LAYER_CASES, ids=ascii)
def test_an_extra_layer_off_the_rule_is_refused_as_unclaimed_by_bind_and_audit(
    tiny: Path, tmp_path: Path, good: str, bad: str
) -> None:
    src = "layers.3.mlp.experts.5.down_proj.weight"
    t = _tensors(tiny)
    d = copy_with(tiny, tmp_path / "ck", {src.replace(good, bad): t[src]})
    want = (
        f"model: 1 tensor(s) outside the layers are neither model-level tensors nor declared "
        f"unbound: [{src.replace(good, bad)!r}] — refusing to skip them"
    )
    with pytest.raises(SpecbindError) as e:
        bind_checkpoint(CheckpointDir(d), TABLE, progress=False)
    assert str(e.value) == want
    assert audit(CheckpointDir(d), TABLE, progress=False)["problems"] == [want]


def test_a_renamed_member_off_the_rule_is_not_renamed_and_is_refused(tmp_path: Path) -> None:
    """Kimi's ``block_sparse_moe.experts.{e}.w1.weight`` -> ``mlp.experts.{e}.gate_proj``:
    member 2 is renamed, ``02`` falls to the prefix rule and its block refuses it."""
    kimi = MODELS["kimi-linear"]
    synth(kimi, tmp_path / "ck", tiny_values(kimi), layers=2, seed=1)
    t = _tensors(tmp_path / "ck")
    src = "layers.1.mlp.experts.2.gate_proj.weight"
    for index, ok in (("2", True), ("02", False)):
        hub = f"layers.1.block_sparse_moe.experts.{index}.w1.weight"
        d = copy_with(tmp_path / "ck", tmp_path / index, {src: None, hub: t[src]})
        view = NamedView(CheckpointDir(d), kimi.layer_pattern, kimi.names)
        assert (src in view.names()) == ok
        if ok:
            bind_checkpoint(CheckpointDir(d), kimi, progress=False)
            continue
        assert f"layers.1.mlp.experts.{index}.w1.weight" in view.names()
        with pytest.raises(SpecbindError, match=r"layer 1: 1 unrecognised mlp tensor\(s\)"):
            bind_checkpoint(CheckpointDir(d), kimi, progress=False)
