"""``synth --sparse``: the same checkpoint as ``synth``, with every data buffer a hole —
headers as the safetensors library writes them, ~5 GB shards, almost no disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors
from safetensors.numpy import save

from specbind.cli import main
from specbind.core.dtypes import DTYPES
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.synth.sparse import SHARD_BYTES


def _census(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in sorted(root.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            head = json.loads(fh.read(n))
        head.pop("__metadata__")
        out |= {k: (v["dtype"], v["shape"]) for k, v in head.items()}
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sparse")
    assert main(["synth", str(root / "dense"), "--layers", "4"]) == 0
    assert main(["synth", str(root / "sparse"), "--layers", "4", "--sparse", "--shards", "3"]) == 0
    return root / "dense", root / "sparse"


def test_sparse_holds_the_same_tensors_and_config_as_dense(pair: tuple[Path, Path]) -> None:
    dense, sparse = pair
    assert _census(sparse) == _census(dense)
    assert (sparse / "config.json").read_text() == (dense / "config.json").read_text()
    index = json.loads((sparse / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(_census(dense))
    assert len(set(index["weight_map"].values())) == 3


def test_a_sparse_shard_is_byte_for_byte_what_safetensors_writes_for_zeros(
    pair: tuple[Path, Path],
) -> None:
    for f in sorted(pair[1].glob("*.safetensors")):
        raw = f.read_bytes()
        zeros = {
            n: np.zeros(t["shape"], dtype=DTYPES[t["dtype"]].numpy)
            for n, t in safetensors.deserialize(raw)
        }
        assert save(zeros, metadata={"format": "pt"}) == raw, f.name


def test_a_sparse_checkpoint_binds_like_any_other(pair: tuple[Path, Path], tmp_path: Path) -> None:
    assert main(["bind", str(pair[1]), "--tp-size", "2", "--tp-rank", "1"]) == 0


def test_the_real_geometry_is_hundreds_of_times_its_disk_use_in_5gb_shards(
    tmp_path: Path,
) -> None:
    out = tmp_path / "full"
    assert main(["synth", str(out), "--full", "--sparse", "--layers", "4", "--no-mtp"]) == 0
    shards = sorted(out.glob("*.safetensors"))
    apparent = sum(f.stat().st_size for f in shards)
    on_disk = sum(f.stat().st_blocks * 512 for f in shards)
    assert apparent > 15e9  # three dense layers, and one MoE layer of 288 experts (14.5 GB)
    assert on_disk < apparent / 1000
    ckpt = CheckpointDir(out)  # every header is valid and the index agrees with the shards
    sizes = [f.stat().st_size for f in shards]
    assert len(shards) > 1 and max(sizes) <= SHARD_BYTES + (16 << 20)  # + its header
    assert len(ckpt.names()) == len(_census(out))
