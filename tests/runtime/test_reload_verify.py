"""A reload verifies what it loads: every field's shape and dtype against the spec at the
recorded geometry and ranks, the exact set of fields the recorded layers require (whatever the
file's counts say), and each tensor's content digest and the record's (issue 22, findings 3-5).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from specbind import open_bound
from specbind.cli import main
from specbind.core.errors import ReloadError
from specbind.core.planning import Ranks
from specbind.generated import MODELS
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.bind.preamble import open_layout, slot_quant
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.layout.config import values_from_config

Tensors = dict[str, Any]
Meta = dict[str, str]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tp 2 / ep 2 rank of the default model, and one rank of DeepSeek (its MLA has a
    ``q_rope`` field), each as ``bind --out`` writes it."""
    root = tmp_path_factory.mktemp("verify")
    out: dict[str, Path] = {}
    for model in ("glm-5.3-flash", "deepseek-v3.2"):
        ck, path = root / model, root / f"{model}.safetensors"
        assert main(["synth", str(ck), "--model", model, "--layers", "4"]) == 0
        ranks = ["--tp-size", "2", "--tp-rank", "1", "--ep-size", "2", "--ep-rank", "0"]
        assert main(["bind", str(ck), "--model", model, *ranks, "--out", str(path)]) == 0
        out[model] = path
    return out


def resave(
    src: Path,
    dst: Path,
    tensors: Callable[[Tensors], None] = lambda t: None,
    meta: Callable[[Meta], None] = lambda m: None,
) -> Path:
    """``src`` saved again (a consistent safetensors file) after ``tensors`` and ``meta`` edit
    its tensors and its metadata."""
    with safe_open(str(src), framework="numpy") as f:
        m = dict(f.metadata())
    t = load_file(str(src))
    tensors(t)
    meta(m)
    save_file(t, str(dst), metadata=m)
    return dst


def rebuild(src: Path, dst: Path, drop: str, meta: Callable[[Meta], None]) -> Path:
    """``src`` written again byte for byte without tensor ``drop`` (any dtype, F8 included,
    which safetensors.numpy cannot save), after ``meta`` edits its metadata."""
    raw = src.read_bytes()
    start = _data_start(src)
    head = json.loads(raw[8:start])
    meta(head["__metadata__"])
    del head[drop]
    data, pos = b"", 0
    for name in sorted(n for n in head if n != "__metadata__"):
        b, e = head[name]["data_offsets"]
        data += raw[start + b : start + e]
        head[name]["data_offsets"] = [pos, pos + e - b]
        pos += e - b
    text = json.dumps(head).encode()
    text += b" " * (-len(text) % 8)
    dst.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return dst


def counted(m: Meta, t: Tensors) -> None:
    m["tensors"] = str(len(t))  # the count edited to match what is left


def edit_layers(m: Meta, edit: Callable[[dict[str, Any]], None]) -> None:
    layers = json.loads(m["layers"])
    edit(layers)
    m["layers"] = json.dumps(layers)


def test_a_w13_saved_again_with_another_shape_is_refused_naming_it(
    files: dict[str, Path], tmp_path: Path
) -> None:
    def cut(t: Tensors) -> None:
        w = t["layers.3.mlp.w13"]  # [E_r, 2 * Im_r, X]
        t["layers.3.mlp.w13"] = np.ascontiguousarray(w[:, : w.shape[1] * 2 // 3])

    bad = resave(files["glm-5.3-flash"], tmp_path / "w13.safetensors", cut)
    with pytest.raises(
        ReloadError, match=r"layers\.3\.mlp\.w13 is BF16 \[3, 32, 72\]; block moe binds BF16 "
        r"\[3, 48, 72\] at the recorded geometry \(tp rank 1 of 2, ep rank 0 of 2\)",
    ):  # fmt: skip
        open_bound(bad)


def test_a_geometry_that_disagrees_with_the_tensors_is_refused_naming_a_field(
    files: dict[str, Path], tmp_path: Path
) -> None:
    def wider(m: Meta) -> None:
        g = json.loads(m["geometry"])
        g["hidden"] += 1
        m["geometry"] = json.dumps(g)

    bad = resave(files["glm-5.3-flash"], tmp_path / "hidden.safetensors", meta=wider)
    with pytest.raises(
        ReloadError, match=r"layers\.0\.attention\.b_proj is BF16 \[8, 72\]; block kda binds "
        r"BF16 \[8, 73\] at the recorded geometry .*the metadata geometry is wrong",
    ):  # fmt: skip
        open_bound(bad)


def _drop_q_rope(t: Tensors, m: Meta) -> None:
    del t["layers.0.attention.q_rope"]


def _drop_layer(t: Tensors, m: Meta) -> None:
    for n in [n for n in t if n.startswith("layers.3.")]:
        del t[n]
    edit_layers(m, lambda layers: layers.pop("3"))


def _drop_globals(t: Tensors, m: Meta) -> None:
    for n in [n for n in t if n.startswith("globals.")]:
        del t[n]


def _drop_mlp(t: Tensors, m: Meta) -> None:
    for n in [n for n in t if n.startswith("layers.2.mlp.")]:
        del t[n]
    edit_layers(m, lambda layers: layers["2"]["slots"].pop("mlp"))


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        (_drop_q_rope, r"layers\.0\.attention\.q_rope is missing: block mla_indexed binds it"),
        (_drop_layer, r"its metadata is not what its bind recorded \(the record digest differs"),
        (_drop_globals, r"globals\.embed_tokens is missing: block lm_globals binds it"),
        (_drop_mlp, r"layer 2 \(decoder\) records no slot mlp; a decoder layer of deepseek"),
    ],
    ids=["q_rope", "layer", "globals", "mlp-slot"],
)
def test_a_dropped_field_is_refused_though_the_counts_were_edited_to_match(
    files: dict[str, Path],
    tmp_path: Path,
    drop: Callable[[Tensors, Meta], None],
    message: str,
) -> None:
    t = load_file(str(files["deepseek-v3.2"]))
    with safe_open(str(files["deepseek-v3.2"]), framework="numpy") as f:
        m = dict(f.metadata())
    drop(t, m)
    counted(m, t)
    save_file(t, str(tmp_path / "short.safetensors"), metadata=m)
    with pytest.raises(ReloadError, match=message):
        open_bound(tmp_path / "short.safetensors")


def _data_start(path: Path) -> int:
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    return 8 + int(n)


@pytest.mark.parametrize("copy", [False, True])
def test_one_changed_byte_is_refused_on_both_reload_paths(
    files: dict[str, Path], tmp_path: Path, copy: bool
) -> None:
    raw = bytearray(files["glm-5.3-flash"].read_bytes())
    raw[_data_start(files["glm-5.3-flash"]) + 1000] ^= 0x01
    bad = tmp_path / "byte.safetensors"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ReloadError, match=r": its bytes are not what its bind wrote \(content"):
        open_bound(bad, copy=copy)


def test_two_fields_of_one_shape_swapped_are_refused(
    files: dict[str, Path], tmp_path: Path
) -> None:
    def swap(t: Tensors) -> None:
        a, b = "layers.0.norms.input_norm", "layers.0.norms.post_attention_norm"
        assert t[a].shape == t[b].shape and t[a].tobytes() != t[b].tobytes()
        t[a], t[b] = t[b], t[a]

    bad = resave(files["glm-5.3-flash"], tmp_path / "swap.safetensors", swap)
    with pytest.raises(ReloadError, match=r"layers\.0\.norms\.input_norm: its bytes are not"):
        open_bound(bad)


@pytest.mark.parametrize(("key", "forged"), [("tp_rank", "0"), ("ep_rank", "1")])
def test_a_forged_rank_in_the_metadata_is_refused(
    files: dict[str, Path], tmp_path: Path, key: str, forged: str
) -> None:
    def forge(m: Meta) -> None:
        assert m[key] != forged
        m[key] = forged

    bad = resave(files["glm-5.3-flash"], tmp_path / "rank.safetensors", meta=forge)
    with pytest.raises(ReloadError, match=r"the record digest differs: a rank, geometry"):
        open_bound(bad)


def test_a_file_written_before_digests_is_refused_asking_for_a_new_bind(
    files: dict[str, Path], tmp_path: Path
) -> None:
    def old(m: Meta) -> None:
        del m["digests"], m["record_digest"]

    bad = resave(files["glm-5.3-flash"], tmp_path / "old.safetensors", meta=old)
    with pytest.raises(
        ReloadError, match=r"written before bound files recorded content digests, so its bytes "
        r"cannot be verified; bind it again$",
    ):  # fmt: skip
        open_bound(bad)


def test_a_packed_field_without_its_scale_is_refused(tmp_path: Path) -> None:
    ck, out = tmp_path / "q", tmp_path / "q.safetensors"
    assert main(["synth", str(ck), "--layers", "4", "--quant", "nvfp4-modelopt"]) == 0
    assert main(["bind", str(ck), "--ep-size", "2", "--ep-rank", "0", "--out", str(out)]) == 0
    assert open_bound(out).tensors["layers.3.mlp.w2"].dtype == np.uint8  # packed

    def fewer(m: Meta) -> None:
        m["tensors"] = str(int(m["tensors"]) - 1)

    bad = rebuild(out, tmp_path / "noscale.safetensors", "layers.3.mlp.w2_weight_scale", fewer)
    with pytest.raises(ReloadError, match=r"layers\.3\.mlp\.w2_weight_scale is missing"):
        open_bound(bad)


@pytest.mark.parametrize(
    ("model", "quant"),
    [
        ("glm-5.3-flash", None),
        ("glm-5.3-flash", "nvfp4-modelopt"),
        ("deepseek-v3.2", None),
        ("kimi-linear", None),
    ],
)
def test_the_expected_shapes_are_the_binders_own_for_every_model_and_rank(
    tmp_path: Path, model: str, quant: str | None
) -> None:
    """``BlockEntry.bound_shapes`` (the generated ``assemble`` on shapes alone) gives every
    field a real bind holds, with its shape and dtype, at every rank of tp 2 x ep 2 (tp 1
    for the quantized checkpoint, whose groups a tp-2 rank would split)."""
    ck = tmp_path / "ck"
    qargs = ["--quant", quant] if quant else []
    assert main(["synth", str(ck), "--model", model, "--layers", "4", *qargs]) == 0
    table, ckpt = MODELS[model], CheckpointDir(ck)
    outs = frozenset({"swizzled", "dequantized"} if quant else ())
    g = table.make_geometry(values_from_config(table, ckpt.config, {}))
    opened = open_layout(ckpt, table)
    per_slot = slot_quant(table, opened, g, outs, False)

    def absent(index: int, slot: str) -> set[str]:  # optional groups the layer does not carry
        if index < 0:
            return set()
        fill = opened.lay.layers[index].slots[slot]
        assert fill.block is not None
        rules = [r for r in fill.block.tensors if r.group is not None]
        return {r.group for r in rules} - {r.group for r in rules if r.name in fill.names}

    tps = [1] if quant else [2]
    for ranks in [Ranks(tp, r, 2, e) for tp in tps for r in range(tp) for e in range(2)]:
        res = bind_checkpoint(
            ckpt, table, tp_size=ranks.tp_size, tp_rank=ranks.tp_rank, ep_size=2,
            ep_rank=ranks.ep_rank, quant_outputs=outs, progress=False,
        )  # fmt: skip
        slots = [(x.index, n, s) for x in res.layers for n, s in x.slots.items()]
        assert res.globals is not None
        slots.append((-1, "globals", res.globals))
        for index, name, s in slots:
            lq = per_slot.get((index, name))
            want = table.block(s.block).bound_shapes(g, ranks, index, lq, absent(index, name))
            got = {f: (s.fields[f].dtype, tuple(a.shape)) for f, a in s.weights.arrays().items()}
            assert got == {f: (x.dtype, x.shape) for f, x in want.items()}, (index, name)
