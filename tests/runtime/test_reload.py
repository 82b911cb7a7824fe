"""A rank's ``--out`` file loads back (``open_bound``, ``bind --from``) exactly as bound, and a
file from another spec, layout or rank is refused, naming what differs."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import patience
import pytest

from specbind import open_bound
from specbind.cli import main
from specbind.core.errors import ReloadError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

TABLE = MODELS["glm-5.3-flash"]


@pytest.fixture(scope="module")
def bound(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("reload")
    ck, out = root / "tiny", root / "r1.safetensors"
    assert main(["synth", str(ck), "--layers", "4"]) == 0
    args = [
        "bind",
        str(ck),
        "--tp-size",
        "2",
        "--tp-rank",
        "1",
        "--ep-size",
        "2",
        "--ep-rank",
        "0",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    return ck, out


def _rewrite(src: Path, dst: Path, edit: object) -> Path:
    """``src`` with its header changed by ``edit(header)``; the data untouched."""
    raw = src.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8 : 8 + n])
    edit(head)  # type: ignore[operator]
    new = json.dumps(head).encode()
    new += b" " * (-len(new) % 8)
    dst.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])
    return dst


@pytest.mark.parametrize("copy", [False, True])
def test_a_reloaded_rank_is_byte_for_byte_what_was_bound(
    bound: tuple[Path, Path], copy: bool
) -> None:
    ck, out = bound
    f = open_bound(out, tp_size=2, tp_rank=1, ep_size=2, ep_rank=0, copy=copy)
    mem = bind_checkpoint(CheckpointDir(ck), TABLE, tp_size=2, tp_rank=1, ep_size=2).fields()
    assert sorted(f.tensors) == sorted(mem)
    for name, (_, a) in mem.items():
        got = f.tensors[name]
        assert got.dtype == a.dtype and got.shape == a.shape, name
        assert got.tobytes() == np.ascontiguousarray(a).tobytes(), name
    arrays = list(f.tensors.values())
    assert all(a.flags.writeable for a in arrays) == copy  # views of the map are read-only
    assert len(f.layers) == 5 and f.ranks.tp_rank == 1 and f.ranks.ep_size == 2


def test_a_file_of_another_rank_is_refused_naming_both(bound: tuple[Path, Path]) -> None:
    with pytest.raises(
        ReloadError,
        match=r"written for tp rank 1, asked for 0 \(the file holds tp rank 1 of 2, ep rank 0 of 2\)",
    ):
        open_bound(bound[1], tp_rank=0)
    with pytest.raises(ReloadError, match=r"written for ep size 2, asked for 1"):
        open_bound(bound[1], ep_size=1)


def test_a_file_of_another_spec_is_refused(bound: tuple[Path, Path], tmp_path: Path) -> None:
    def edit(h: dict[str, dict[str, str]]) -> None:
        h["__metadata__"]["specs_sha256"] = "0" * 64

    bad = _rewrite(bound[1], tmp_path / "spec.safetensors", edit)
    with pytest.raises(ReloadError, match=r"generated from other specs \(sha256 000000000000"):
        open_bound(bad)


def test_a_file_of_another_layout_is_refused(bound: tuple[Path, Path], tmp_path: Path) -> None:
    def swap(h: dict[str, dict[str, str]]) -> None:
        layers = json.loads(h["__metadata__"]["layers"])
        layers["0"]["slots"]["attention"] = "moe"  # a block the attention slot never holds
        h["__metadata__"]["layers"] = json.dumps(layers)

    bad = _rewrite(bound[1], tmp_path / "layout.safetensors", swap)
    with pytest.raises(ReloadError, match=r"layer 0 holds block 'moe' in slot 'attention'"):
        open_bound(bad)

    def stray(h: dict[str, dict[str, str]]) -> None:
        layers = json.loads(h["__metadata__"]["layers"])
        del layers["1"]  # its tensors are still in the file
        h["__metadata__"]["layers"] = json.dumps(layers)

    bad = _rewrite(bound[1], tmp_path / "stray.safetensors", stray)
    with pytest.raises(ReloadError, match=r"tensor layers\.1\.\S+ is no field of the layers"):
        open_bound(bad)


def test_a_geometry_these_binders_refuse_is_refused(
    bound: tuple[Path, Path], tmp_path: Path
) -> None:
    def edit(h: dict[str, dict[str, str]]) -> None:
        g = json.loads(h["__metadata__"]["geometry"])
        g["no_such_symbol"] = 3
        h["__metadata__"]["geometry"] = json.dumps(g)

    bad = _rewrite(bound[1], tmp_path / "geo.safetensors", edit)
    with pytest.raises(ReloadError, match=r"geometry names no_such_symbol, unknown to"):
        open_bound(bad)


def test_bind_from_loads_and_refuses_in_one_line(bound: tuple[Path, Path]) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "specbind", "bind", "--from", str(bound[1]), *args]
        return patience.run(cmd, capture_output=True, text=True, cpu=120)

    ok = run("--tp-size", "2", "--tp-rank", "1", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["tp_rank"] == 1
    bad = run("--tp-size", "8")
    assert bad.returncode == 1  # refused: the file is another rank's
    assert bad.stderr.count("\n") == 1 and "written for tp size 2, asked for 8" in bad.stderr


def test_a_quantized_rank_streams_out_and_reloads_with_its_companions(tmp_path: Path) -> None:
    """The packed fields (U8), their scales (F8_E4M3, F32) and the optional layouts are
    announced before any byte is read, recorded in the metadata, and accepted on reload."""
    ck, out = tmp_path / "q", tmp_path / "q.safetensors"
    assert main(["synth", str(ck), "--layers", "4", "--quant", "nvfp4-modelopt"]) == 0
    args = ["bind", str(ck), "--ep-size", "2", "--ep-rank", "1", "--out", str(out)]
    assert main([*args, "--quant-output", "swizzled", "--quant-output", "dequantized"]) == 0
    f = open_bound(out, ep_size=2, ep_rank=1)
    mem = bind_checkpoint(
        CheckpointDir(ck), TABLE, ep_size=2, ep_rank=1, quant_outputs=("swizzled", "dequantized")
    ).fields()
    assert sorted(f.tensors) == sorted(mem)
    dtypes = {str(f.tensors[n].dtype) for n in f.tensors}
    assert {"uint8", "float8_e4m3fn", "bfloat16", "float32"} <= dtypes
    for name, (_, a) in mem.items():
        assert f.tensors[name].tobytes() == np.ascontiguousarray(a).tobytes(), name
    raw = out.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    quant = json.loads(json.loads(raw[8 : 8 + n])["__metadata__"]["quant"])
    assert quant == {"scheme": "nvfp4-modelopt", "weight_only": False,
                     "outputs": ["dequantized", "swizzled"]}  # fmt: skip


def test_a_file_missing_a_field_is_refused_by_its_recorded_count(
    bound: tuple[Path, Path], tmp_path: Path
) -> None:
    """Saved again without one tensor (a consistent file, every entry valid), it still holds
    one tensor fewer than its bind wrote."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    with safe_open(str(bound[1]), framework="numpy") as f:
        meta = f.metadata()
    tensors = load_file(str(bound[1]))
    dropped = sorted(tensors)[0]
    del tensors[dropped]
    save_file(tensors, str(tmp_path / "short.safetensors"), metadata=meta)
    with pytest.raises(
        ReloadError, match=r"holds \d+ tensor\(s\), its bind wrote \d+: a field is missing"
    ):
        open_bound(tmp_path / "short.safetensors")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("geometry", "{not json", r"metadata geometry is not an object of integers"),
        ("layers", "{not json", r"metadata layers is not an object"),
        ("tp_size", "²", r"metadata tp_size='²' is not a count"),
        ("quant", json.dumps({"scheme": ["x"]}), r"metadata quant names no scheme"),
        (
            "quant",
            json.dumps({"scheme": "nvfp4-modelopt", "outputs": "swizzled"}),
            r"not a list of",
        ),
        ("digests", json.dumps({"algorithm": "md5"}), r"name algorithm 'md5', not 'xxh3_128'"),
        (
            "digests",
            json.dumps({"algorithm": "xxh3_128", "tensors": {"x": "00"}}),
            r"metadata digests is not an object of 32-digit hex digests",
        ),
        ("record_digest", "0" * 31, r"metadata record_digest is missing or not a 32-digit hex"),
    ],
)
def test_malformed_metadata_is_refused_in_one_line(
    bound: tuple[Path, Path], tmp_path: Path, key: str, value: str, message: str
) -> None:
    def edit(h: dict[str, dict[str, str]]) -> None:
        h["__metadata__"][key] = value

    bad = _rewrite(bound[1], tmp_path / "meta.safetensors", edit)
    with pytest.raises(ReloadError, match=message):
        open_bound(bad)


def test_a_layer_with_an_unknown_role_is_refused(bound: tuple[Path, Path], tmp_path: Path) -> None:
    def edit(h: dict[str, dict[str, str]]) -> None:
        layers = json.loads(h["__metadata__"]["layers"])
        layers["0"]["role"] = "encoder"
        h["__metadata__"]["layers"] = json.dumps(layers)

    bad = _rewrite(bound[1], tmp_path / "role.safetensors", edit)
    with pytest.raises(ReloadError, match=r"layers\['0'\] has role 'encoder', not one of"):
        open_bound(bad)


def test_the_reader_checks_against_the_tables_and_hash_its_caller_passes(
    bound: tuple[Path, Path],
) -> None:
    """runtime.bound.reload knows no generated code: a caller without this model, or with another
    spec hash, is refused; with the generated ones, the file opens."""
    from specbind.generated import SPECS_SHA256
    from specbind.runtime.bound.reload import read_bound as read

    with pytest.raises(ReloadError, match=r"model glm-5\.3-flash, which these binders do not"):
        read(bound[1], models={}, specs_sha256=SPECS_SHA256)
    with pytest.raises(ReloadError, match=r"these are 111111111111\); bind it again"):
        read(bound[1], models=MODELS, specs_sha256="1" * 64)
    f = read(bound[1], models=MODELS, specs_sha256=SPECS_SHA256)
    assert f.meta.model == "glm-5.3-flash" and f.meta.ranks == f.ranks


def _requant(bound: Path, dst: Path, quant: dict[str, object]) -> Path:
    """``bound`` recording ``quant``, its record digest made again (a consistent forgery)."""
    from specbind.runtime.bound.bound_format import RECORD_KEY, record_digest

    def edit(h: dict[str, dict[str, str]]) -> None:
        h["__metadata__"]["quant"] = json.dumps(quant)
        h["__metadata__"][RECORD_KEY] = record_digest(h["__metadata__"])

    return _rewrite(bound, dst, edit)


@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4-modelopt", "fp8-block"])
def test_a_quant_record_no_field_reflects_is_refused_naming_the_scheme(
    bound: tuple[Path, Path], tmp_path: Path, scheme: str
) -> None:
    bad = _requant(bound[1], tmp_path / "q.safetensors", {"scheme": scheme, "outputs": []})
    with pytest.raises(ReloadError) as e:
        open_bound(bad)
    assert f"metadata quant records scheme {scheme}, but no field is stored in its packed" in str(
        e.value
    )


@pytest.mark.parametrize(
    ("quant", "message"),
    [
        ({"scheme": "nvfp4-modelopt", "outputs": ["swizzled", "swizzled"]}, "name an output twice"),
        ({"scheme": "fp8-block", "outputs": ["swizzled"]}, "swizzled output, which fp8-block does"),
        ({"scheme": "mxfp4", "weight_only": True}, "weight_only, which mxfp4 has no form of"),
    ],
)
def test_a_quant_record_naming_what_its_scheme_cannot_make_is_refused(
    bound: tuple[Path, Path], tmp_path: Path, quant: dict[str, object], message: str
) -> None:
    bad = _requant(bound[1], tmp_path / "q.safetensors", quant)
    with pytest.raises(ReloadError, match=message):
        open_bound(bad)


def test_a_bind_that_stores_no_linear_quantized_records_no_quant_and_reloads(
    tmp_path: Path,
) -> None:
    """mxfp4 stores stacked linears only: every linear of this model is left out (excluded),
    so no field reflects the scheme and the file records none."""
    ck, out = tmp_path / "q", tmp_path / "q.safetensors"
    assert main(["synth", str(ck), "--layers", "2", "--quant", "mxfp4"]) == 0
    assert main(["bind", str(ck), "--out", str(out)]) == 0
    raw = out.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert "quant" not in json.loads(raw[8 : 8 + n])["__metadata__"]
    assert open_bound(out).tensors
