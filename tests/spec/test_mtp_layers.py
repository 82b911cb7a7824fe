"""MTP layers are declared per model: bound when present, refused in one line naming
``--no-mtp`` when config.json counts one the file lacks, and left out on request.

Claims:
* a DeepSeek-V3.2 checkpoint with the hub's MTP layer (``model.layers.{L}``: MLA with the
  indexer, MoE, norms, the MTP extras and their embedding and LM head copies) binds it as an
  ``mtp`` layer at every tp, the copies split by vocabulary rows as the model's own;
* transformers' save keeps ``num_nextn_predict_layers: 1`` and writes no MTP layer: bind,
  the CLI and audit say so in one line naming ``--no-mtp``; with it the decoder binds alone;
* with ``--no-mtp`` an MTP layer the file has is set aside unread, and the result says which;
* a GLM-5.3-Flash checkpoint re-saved without its MTP layer behaves the same through the CLI.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specbind.audit import audit
from specbind.cli import main
from specbind.core.errors import BindError, SpecbindError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.bind.bind_options import BindOptions
from specbind.runtime.io.checkpoint import CheckpointDir

torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)

TABLE = MODELS["deepseek-v3.2"]


@pytest.fixture(scope="module")
def decoder_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As transformers writes it: config.json counts one MTP layer, the file has none."""
    from deepseek_model import write_deepseek_checkpoint

    path = tmp_path_factory.mktemp("v32_saved")
    write_deepseek_checkpoint(path, seed=0)
    return path


@pytest.fixture(scope="module")
def with_mtp(decoder_only: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The same checkpoint with the hub's MTP layer 4 (layer 61 of the real model) added."""
    from mtp_layer import add_mtp_layer

    path = tmp_path_factory.mktemp("v32_hub")
    for f in decoder_only.iterdir():
        shutil.copy(f, path / f.name)
    return path, add_mtp_layer(path, seed=7)


def _bind(path: Path, tp: int = 1, rank: int = 0, mtp: bool = True) -> Any:
    return bind_checkpoint(
        CheckpointDir(path), TABLE, tp_size=tp, tp_rank=rank, progress=False, mtp=mtp
    )


def _np(t: Any) -> Any:
    return t.float().numpy().astype(np.float64)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_hub_mtp_layer_binds_as_an_mtp_layer_at_every_tp(
    with_mtp: tuple[Path, Any], tp: int
) -> None:
    path, added = with_mtp
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    rows = vocab // tp
    for rank in range(tp):
        result = _bind(path, tp, rank)
        last = result.layers[-1]
        assert (last.index, last.role) == (4, "mtp")
        assert {s: b.block for s, b in last.slots.items()} == {
            "attention": "mla_indexed", "mlp": "moe", "norms": "layer_norms", "mtp": "mtp_head"
        }  # fmt: skip
        head = last.slots["mtp"].weights.arrays()
        for field, name in (("enorm", "enorm.weight"), ("eh_proj", "eh_proj.weight")):
            want = _np(added[f"model.layers.4.{name}"])
            assert np.array_equal(head[field].astype(np.float64), want), field
        for field, name in (("embed_tokens", "embed_tokens.weight"),
                            ("shared_head", "shared_head.head.weight")):  # fmt: skip
            want = _np(added[f"model.layers.4.{name}"])[rank * rows : (rank + 1) * rows]
            assert np.array_equal(head[field].astype(np.float64), want), (field, rank)
        assert all(x.role == "decoder" for x in result.layers[:-1])


def test_audit_accounts_for_every_tensor_of_the_hub_mtp_layer(with_mtp: tuple[Path, Any]) -> None:
    path, _ = with_mtp
    rep = audit(CheckpointDir(path), TABLE, progress=False)
    assert rep["problems"] == []
    assert rep["coverage"]["unaccounted"] == 0
    assert rep["coverage"]["bound"] == rep["stored_tensors"]
    assert {r["index"]: r["role"] for r in rep["layers"]}[4] == "mtp"


def test_a_config_counting_an_mtp_layer_the_file_lacks_is_refused_naming_no_mtp(
    decoder_only: Path,
) -> None:
    with pytest.raises(BindError) as e:
        _bind(decoder_only)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("layer 4: config.json num_nextn_predict_layers is 1")
    assert "no MTP layer" in msg and "--no-mtp" in msg and "BindOptions(mtp=False)" in msg
    rep = audit(CheckpointDir(decoder_only), TABLE, progress=False)
    assert rep["problems"] == [msg], "audit lists what bind refuses"


def test_no_mtp_binds_the_decoder_alone(decoder_only: Path) -> None:
    result = _bind(decoder_only, mtp=False)
    assert [x.index for x in result.layers] == [0, 1, 2, 3]
    assert result.mtp_skipped == [] and "mtp_not_bound" not in result.as_dict()
    rep = audit(CheckpointDir(decoder_only), TABLE, progress=False, mtp=False)
    assert rep["problems"] == [] and rep["coverage"]["unaccounted"] == 0


def test_no_mtp_sets_a_present_mtp_layer_aside_unread_and_says_which(
    with_mtp: tuple[Path, Any],
) -> None:
    path, added = with_mtp
    result = _bind(path, mtp=False)
    assert [x.index for x in result.layers] == [0, 1, 2, 3]
    assert result.mtp_skipped == [4] and result.as_dict()["mtp_not_bound"] == [4]
    rep = audit(CheckpointDir(path), TABLE, progress=False, mtp=False)
    assert rep["problems"] == [] and rep["mtp_not_bound"] == [4]
    assert rep["coverage"]["mtp_not_bound"] == len(added)
    assert rep["coverage"]["bound"] + len(added) == rep["stored_tensors"]


def test_the_option_is_one_for_the_api_and_the_cli(with_mtp: tuple[Path, Any]) -> None:
    import specbind

    path, _ = with_mtp
    ck = specbind.open(path)
    by_keyword = ck.bind(mtp=False)
    by_options = ck.bind(options=BindOptions(mtp=False))
    assert [x.index for x in by_keyword.layers] == [x.index for x in by_options.layers]
    assert [x.index for x in by_keyword.layers] == [0, 1, 2, 3]
    with pytest.raises(SpecbindError, match="not both"):
        ck.bind(options=BindOptions(), mtp=False)
    with pytest.raises(BindError, match=r"mtp is 'no', expected True or False"):
        BindOptions(mtp="no")  # type: ignore[arg-type]


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def test_a_glm_checkpoint_resaved_without_its_mtp_layer_is_refused_then_bound_with_no_mtp(
    tmp_path: Path,
) -> None:
    """transformers' glm5_next drops layer 45 on load and keeps num_nextn_predict_layers."""
    ckpt = tmp_path / "glm"
    rc, _, err = _cli("synth", str(ckpt), "--model", "glm-5.3-flash", "--layers", "4", "--no-mtp")
    assert rc == 0, err
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1  # what the hub config says, and a re-save keeps
    (ckpt / "config.json").write_text(json.dumps(cfg))
    rc, _, err = _cli("bind", str(ckpt))
    lines = err.strip().splitlines()
    assert rc != 0 and len(lines) == 1, err
    assert "layer 4: config.json num_nextn_predict_layers is 1" in lines[0]
    assert "--no-mtp" in lines[0]
    rc, out, err = _cli("bind", str(ckpt), "--no-mtp")
    assert rc == 0, err
    assert "bound 4 layer(s)" in out
    rc, out, err = _cli("audit", str(ckpt), "--no-mtp", "--json")
    assert rc == 0 and json.loads(out)["problems"] == [], err
    rc, _, err = _cli("plan", str(ckpt), "--tp-size", "2")
    assert rc != 0 and "--no-mtp" in err and len(err.strip().splitlines()) == 1, err
    rc, out, err = _cli("plan", str(ckpt), "--tp-size", "2", "--no-mtp", "--json")
    assert rc == 0, err


def test_an_mtp_layer_config_json_does_not_count_is_refused_saying_what_it_may_be(
    with_mtp: tuple[Path, Any], tmp_path: Path
) -> None:
    path, _ = with_mtp
    uncounted = tmp_path / "uncounted"
    shutil.copytree(path, uncounted)
    cfg = json.loads((uncounted / "config.json").read_text())
    del cfg["num_nextn_predict_layers"]
    (uncounted / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BindError) as e:
        _bind(uncounted)
    assert str(e.value) == (
        "layer 4: config.json num_hidden_layers is 4, so there is no layer 4, but the checkpoint "
        "has one (an MTP layer? config.json num_nextn_predict_layers counts none)"
    )
