"""The Python API guide's table of which results are views of the files holds: each call it
lists, bound before the files are rewritten in place (every data byte flipped, the size kept),
shows the new bytes where the table says its fields are views and keeps every byte where it
says they are copies; the table lists exactly the calls checked here."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import specbind
from specbind.cli import main
from specbind.generated import MODELS
from specbind.synth import synth, tiny_values

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "python-api.md"
MODEL = MODELS["qwen3-moe"]  # verbatim fields (views) and stacked experts (made) side by side


def table() -> dict[str, str]:
    """The guide's rows: call -> what happens to its fields after a rewrite in place."""
    text = GUIDE.read_text()
    head = "## Which results are views of the files"
    assert head in text, "the guide says which results are views of the files"
    section = text[text.index(head) :]
    rows = re.findall(r"^\| `([^`]+)` \| [^|]+ \| ([^|]+) \|$", section, re.M)
    return {call: after.strip() for call, after in rows}


def as_bytes(tensors: dict[str, Any]) -> dict[str, np.ndarray]:
    out = {}
    for name, t in tensors.items():
        if type(t).__module__.startswith("torch"):
            import torch

            t = t.view(torch.uint8).numpy()
        out[name] = np.asarray(t).reshape(-1).view(np.uint8)
    return out


def rewrite_in_place(path: Path) -> None:
    """Every byte after the header flipped, written into the same file (same inode, size)."""
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start:] = bytes(b ^ 0x55 for b in data[start:])
    with path.open("r+b") as f:
        f.write(data)


def test_the_guides_table_of_views_and_copies_holds_for_every_call_it_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, bound = tmp_path / "ck", tmp_path / "rank0.safetensors"
    synth(MODEL, ckpt, tiny_values(MODEL), layers=2, seed=8)
    assert main(["bind", str(ckpt), "--out", str(bound)]) == 0
    capsys.readouterr()
    ck = specbind.open(ckpt)
    calls: dict[str, Callable[[], dict[str, Any]]] = {
        "ck.bind()": lambda: ck.bind().tensors(),
        "ck.bind(into=specbind.Arena())": lambda: ck.bind(into=specbind.Arena()).tensors(),
        'ck.bind(backend="torch")': lambda: ck.bind(backend="torch").tensors(),
        "ck.bind(into=specbind.Arena(separate=True, file_views=True))": lambda: ck.bind(
            into=specbind.Arena(separate=True, file_views=True)
        ).tensors(),
        "specbind.open_bound(path)": lambda: specbind.open_bound(bound).tensors,
        "specbind.open_bound(path, copy=True)": lambda: (
            specbind.open_bound(bound, copy=True).tensors
        ),
    }
    rows = table()
    assert sorted(rows) == sorted(calls), "the table lists exactly the calls checked"
    pytest.importorskip("torch")
    results = {call: as_bytes(make()) for call, make in calls.items()}
    before = {c: {n: a.copy() for n, a in r.items()} for c, r in results.items()}
    for shard in [*ckpt.glob("*.safetensors"), bound]:
        rewrite_in_place(shard)
    for call, after in rows.items():
        changed = {n for n, a in results[call].items() if not np.array_equal(a, before[call][n])}
        if after == "nothing changes":
            assert not changed, f"{call}: {sorted(changed)[:3]} changed"
        else:
            assert changed, f"{call}: the table says its fields change, none did"
    made = {n for n in results["ck.bind()"] if n.endswith((".w13", ".w2"))}
    changed = {
        n for n, a in results["ck.bind()"].items() if not np.array_equal(a, before["ck.bind()"][n])
    }
    assert made and not made & changed, "made fields are memory of their own"
    assert changed == set(results["ck.bind()"]) - made, "every other field is a view"
