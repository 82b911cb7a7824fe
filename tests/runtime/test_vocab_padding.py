"""A vocabulary that tp does not divide binds in the default layout, padded as vLLM's
VocabParallelEmbedding pads it (pad_vocab_size to a multiple of 64, then equal shares, zero
rows past the stored vocabulary); a tp that divides it binds the stored rows unpadded, as
before. The expectations are numpy slices of the stored tensors, read with safetensors."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rank_pieces import every_rank
from safetensors import safe_open

import specbind
from specbind.cli import main
from specbind.core.errors import SpecError
from specbind.generated import MODELS
from specbind.generator import yamlio
from specbind.generator.block_spec import parse_block
from specbind.runtime.ranks import byte_coverage
from specbind.synth import synth, tiny_values

LLAMA = MODELS["llama"]
PRIME = 181  # no tp in 2..4 divides it; padded to 192, which 2, 3 and 4 split
GEOMETRY = {"heads": 12, "kv_heads": 12}  # tp 2, 3 and 4 split the attention too


def _checkpoint(root: Path, vocab: int) -> Path:
    d = root / f"vocab{vocab}"
    synth(LLAMA, d, tiny_values(LLAMA) | GEOMETRY | {"vocab": vocab}, layers=2, seed=3)
    return d


def _stored(ck: Path, name: str) -> np.ndarray[Any, Any]:
    """The stored BF16 tensor's bits, as int16, read by safetensors (torch), not specbind."""
    for f in sorted(ck.glob("*.safetensors")):
        with safe_open(f, framework="pt") as h:
            if name in h.keys():  # noqa: SIM118 (safe_open has no __contains__)
                import torch

                out: np.ndarray[Any, Any] = h.get_tensor(name).view(torch.int16).numpy()
                return out
    raise AssertionError(f"{name} not in {ck}")


def _bits(a: Any) -> np.ndarray[Any, Any]:
    return np.asarray(a).view(np.int16)


@pytest.fixture(scope="module")
def prime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("pad"), PRIME)


@pytest.mark.parametrize("tp", [2, 3])
def test_a_vocabulary_no_tp_divides_binds_each_rank_its_padded_share_then_zero_rows(
    prime: Path, tp: int
) -> None:
    per = 192 // tp  # pad_vocab_size(181, 64) = 192, split in tp equal shares
    ck = specbind.open(prime)
    fields = {"embed_tokens": "embed_tokens.weight", "lm_head": "lm_head.weight"}
    ranks = [ck.bind(tp_rank=r, tp_size=tp).globals for r in range(tp)]
    for field, name in fields.items():
        stored = _stored(prime, name)
        parts = []
        for r, g in enumerate(ranks):
            assert g is not None
            got = _bits(g.tensors[field])
            lo, hi = min(r * per, PRIME), min((r + 1) * per, PRIME)
            assert got.shape == (per, stored.shape[1]), (field, r)
            assert np.array_equal(got[: hi - lo], stored[lo:hi]), (field, r)
            assert not got[hi - lo :].any(), (field, r)  # the padding rows are zeros
            parts.append(got)
        whole = np.concatenate(parts)
        assert whole.shape[0] == 192
        assert np.array_equal(whole[:PRIME], stored)  # the ranks together are the tensor


@pytest.mark.parametrize("tp", [2, 3])
def test_the_padded_ranks_compute_the_embedding_and_logits_as_vllm_parallel_layers_do(
    prime: Path, tp: int
) -> None:
    """vLLM's VocabParallelEmbedding.forward: each rank looks up the ids in its share
    ``[r·P/tp, (r+1)·P/tp)`` (others masked to 0), summed over ranks; ParallelLMHead: each rank's
    logits gathered in rank order, cut to the real vocabulary (LogitsProcessor). Both equal the
    stored tensors' lookup and product."""
    per = 192 // tp
    ids = np.array([0, 1, per - 1, per, min(2 * per, PRIME) - 1, PRIME - 1, 97, 150])
    h = np.random.default_rng(0).standard_normal((5, 40)).astype(np.float32)
    ranks = [specbind.open(prime).bind(tp_rank=r, tp_size=tp).globals for r in range(tp)]
    embed = [np.asarray(g.tensors["embed_tokens"]).astype(np.float32) for g in ranks if g]
    head = [np.asarray(g.tensors["lm_head"]).astype(np.float32) for g in ranks if g]
    looked = np.zeros((len(ids), 40), np.float32)
    for r, w in enumerate(embed):
        mine = (ids >= r * per) & (ids < (r + 1) * per)
        looked += np.where(mine[:, None], w[np.where(mine, ids - r * per, 0)], 0)
    logits = np.concatenate([h @ w.T for w in head], axis=1)[:, :PRIME]

    def f32(name: str) -> np.ndarray[Any, Any]:  # BF16 bits -> F32 (the high half of an F32)
        bits = _stored(prime, name).astype(np.uint16).astype(np.uint32) << 16
        out: np.ndarray[Any, Any] = bits.view(np.float32)
        return out

    assert np.array_equal(looked, f32("embed_tokens.weight")[ids])
    np.testing.assert_allclose(logits, h @ f32("lm_head.weight").T, rtol=1e-5, atol=1e-5)


def test_a_padded_rank_records_its_padding_in_the_report_and_the_file_and_reloads(
    prime: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rank1.safetensors"
    argv = ["bind", str(prime), "--tp-size", "2", "--tp-rank", "1", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "lm_globals.embed_tokens.weight has 181 rows, padded to 192" in text
    with safe_open(out, framework="np") as h:
        meta = h.metadata()
    want = [PRIME, 192]
    assert json.loads(meta["padding"]) == {
        "lm_globals.embed_tokens.weight": want,
        "lm_globals.lm_head.weight": want,
    }
    assert json.loads(meta["geometry"])["vocab"] == PRIME  # the real vocabulary
    back = specbind.open_bound(out, tp_rank=1, tp_size=2)
    bound = specbind.open(prime).bind(tp_rank=1, tp_size=2).globals
    assert bound is not None
    got = _bits(back.tensors["globals.embed_tokens"])
    assert got.shape == (96, 40)
    assert np.array_equal(got, _bits(bound.tensors["embed_tokens"]))
    assert main(["bind", "--from", str(out), "--tp-size", "2", "--tp-rank", "1"]) == 0
    assert "loaded 19 tensor(s)" in capsys.readouterr().out
    report = json.loads(_json_bind(prime, capsys))
    assert report["padding"]["lm_globals.lm_head.weight"] == want


def _json_bind(ck: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["bind", str(ck), "--tp-size", "2", "--tp-rank", "0", "--json"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("tp", [2, 3])
def test_the_ranks_of_a_padded_split_read_every_stored_row_exactly_once(
    prime: Path, tp: int
) -> None:
    by_rank, claimed = every_rank(prime, LLAMA, tp)
    assert byte_coverage.check(by_rank, claimed) == []
    # and a rank missing leaves its stored rows read by no rank
    problems = byte_coverage.check(by_rank[:-1], claimed)
    assert any(p.startswith("embed_tokens.weight") or "embed_tokens" in p for p in problems)


def test_plan_at_tp_2_of_the_hunyuan_dense_vocabulary_pads_and_names_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--model", "hunyuan-dense", "--tp-size", "2"]) == 0
    text = capsys.readouterr().out
    assert "vocab = 128167 padded to 128192" in text
    assert "as expected" in text  # the sum over ranks counts the padding rows
    assert main(["plan", "--model", "hunyuan-dense", "--tp-size", "2", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    embed = next(t for t in rep["blocks"]["lm_globals"]["tensors"] if t["name"].startswith("embed"))
    assert (embed["units"], embed["padded"]) == (128167, 128192)
    local = {t["name"]: t for t in rep["ranks"][1]["tensors"]["lm_globals"]}
    assert local["embed_tokens.weight"]["local_shape"][0] == 128192 // 2
    assert local["embed_tokens.weight"]["zero_rows"] == 128192 - 128167


@pytest.mark.parametrize("tp", [2, 3, 4])
def test_a_tp_that_divides_the_vocabulary_binds_the_stored_rows_unpadded_as_before(
    tmp_path: Path, tp: int, capsys: pytest.CaptureFixture[str]
) -> None:
    vocab = 156  # 2·78 = 3·52 = 4·39 (vLLM pads it to 192: here it splits unpadded)
    ck = _checkpoint(tmp_path, vocab)
    per = vocab // tp
    stored = _stored(ck, "embed_tokens.weight")
    for r in range(tp):
        g = specbind.open(ck).bind(tp_rank=r, tp_size=tp).globals
        assert g is not None
        got = _bits(g.tensors["embed_tokens"])
        assert got.shape == (per, stored.shape[1])  # vocab / tp rows, no padding row
        assert np.array_equal(got, stored[r * per : (r + 1) * per])
    out = tmp_path / "r0.safetensors"
    assert main(["bind", str(ck), "--tp-size", str(tp), "--tp-rank", "0", "--out", str(out)]) == 0
    assert "padded" not in capsys.readouterr().out
    with safe_open(out, framework="np") as h:
        assert "padding" not in h.metadata()  # the header as before padding existed


def test_a_padded_unit_on_a_tensor_that_does_not_split_one_row_a_unit_is_refused_at_generate(
    tmp_path: Path,
) -> None:
    root = Path(specbind.__file__).parent
    text = (root / "specs/blocks/lm_globals.yaml").read_text()
    bad = text.replace(
        "lm_head.weight:\n    dtype: BF16\n    shape: [vocab, hidden]\n    shard: {rows: vocab}",
        "lm_head.weight:\n    dtype: BF16\n    shape: [hidden, vocab]\n    shard: {cols: vocab}",
    )
    assert bad != text
    p = tmp_path / "lm_globals.yaml"
    p.write_text(bad)
    with pytest.raises(SpecError, match="'vocab' is padded: a tensor sharding on it splits rows"):
        parse_block(yamlio.load(p, "specs/blocks/lm_globals.yaml"))


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (None, "records padding {}, these binders pad"),
        ({"lm_globals.embed_tokens.weight": [181, 256]}, "records padding"),
        ({"lm_globals.embed_tokens.weight": [200, 192]}, "padding is not {tensor: [stored"),
    ],
)
def test_a_padded_file_whose_padding_record_is_not_the_binders_is_refused(
    prime: Path, tmp_path: Path, record: Any, why: str
) -> None:
    from specbind.core.errors import ReloadError
    from specbind.runtime.bound.bound_format import RECORD_KEY, record_digest

    out = tmp_path / "r0.safetensors"
    assert main(["bind", str(prime), "--tp-size", "3", "--tp-rank", "0", "--out", str(out)]) == 0
    raw = out.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8 : 8 + n])
    meta = head["__metadata__"]
    if record is None:
        del meta["padding"]
    else:
        meta["padding"] = json.dumps(record)
    meta[RECORD_KEY] = record_digest(meta)  # the record re-signed: the padding check alone
    new = json.dumps(head).encode()
    new += b" " * (-len(new) % 8)
    edited = tmp_path / "edited.safetensors"
    edited.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])
    with pytest.raises(ReloadError, match=re.escape(why)):
        specbind.open_bound(edited, tp_rank=0, tp_size=3)
