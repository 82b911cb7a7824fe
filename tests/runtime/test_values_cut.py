"""A value of a megabyte in config.json (or given to the API) is shown cut in the one-line
refusal, by the one helper every message that echoes a user's value uses (``core.shown``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import specbind
from specbind.core.errors import SpecbindError
from specbind.core.shown import LIMIT, shown
from specbind.generated import MODELS
from specbind.synth import synth, tiny_values

BIG = "x" * (1 << 20)
# a geometry field, a flag, a per-layer list, a schedule and the model type each
MODELS_TRIED = ("llama", "glm-5.3-flash", "deepseek-v3", "qwen3-next")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in MODELS_TRIED:
        table = MODELS[name]
        out[name] = tmp_path_factory.mktemp("cut") / name
        synth(table, out[name], tiny_values(table), layers=2, seed=2)
    return out


def refusal(ck: Path, config: dict[str, Any]) -> str | None:
    """The one line opening, auditing and binding ``ck`` with ``config`` refuses it with."""
    (ck / "config.json").write_text(json.dumps(config))
    try:
        opened = specbind.open(ck)
        opened.bind()
    except SpecbindError as e:
        return str(e)
    return None


@pytest.mark.parametrize("model", MODELS_TRIED)
@pytest.mark.parametrize(
    "hostile",
    [BIG, [BIG] * 4, {"a": BIG}, list(range(1 << 18))],
    ids=["str", "list", "obj", "ints"],
)
def test_a_config_value_of_a_megabyte_is_shown_cut_in_the_refusal(
    ckpts: dict[str, Path], tmp_path: Path, model: str, hostile: Any
) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(ckpts[model], ck)
    config = json.loads((ckpts[model] / "config.json").read_text())
    refused = 0
    for key in config:  # each field at the top level, and the list entries of a per-layer list
        edits = [{**config, key: hostile}]
        if isinstance(config[key], list) and config[key]:
            edits.append({**config, key: [hostile, *config[key][1:]]})
        for edit in edits:
            line = refusal(ck, edit)
            if line is None:
                continue  # a field no binder reads: nothing echoed
            refused += 1
            assert "\n" not in line and len(line) < 1500, f"{key}: {len(line)} characters"
    assert refused >= 3, "the geometry, the model type and more are read, so refused"


def test_shown_keeps_a_short_value_as_repr_and_cuts_a_long_one_saying_its_length() -> None:
    assert shown("head_dim") == "'head_dim'" and shown([1, 2]) == "[1, 2]"
    assert shown(None) == "None" and shown(True) == "True" and shown(1.5) == "1.5"
    long = shown("ab" * 500_000)
    assert long.startswith("'abab") and long.endswith("' (1000000 characters)")
    assert len(long) <= LIMIT
    assert shown(10**5000) == "<an integer of 16610 bits>"  # str() of it raises ValueError
    assert len(shown([[["x" * 10**5] * 100] * 100] * 100)) <= LIMIT + 20
    assert "\n" not in shown("a\nb" * 1000)


def write_safetensors(path: Path, header: dict[str, Any], data: bytes = b"") -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


@pytest.mark.parametrize(
    "header",
    [
        {BIG: {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}},
        {"w": {"dtype": BIG, "shape": [1], "data_offsets": [0, 2]}},
        {"w": {"dtype": "BF16", "shape": [BIG], "data_offsets": [0, 2]}},
        {"w": {"dtype": "BF16", "shape": [1], "data_offsets": [0, BIG]}},
    ],
    ids=["name", "dtype", "shape", "offsets"],
)
def test_a_safetensors_header_value_of_a_megabyte_is_shown_cut(
    ckpts: dict[str, Path], tmp_path: Path, header: dict[str, Any]
) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    shutil.copy(ckpts["llama"] / "config.json", ck / "config.json")
    write_safetensors(ck / "model.safetensors", header, b"\0\0")
    with pytest.raises(SpecbindError) as e:
        specbind.open(ck).bind()
    assert len(str(e.value)) < 1000 and "(1048576 characters)" in str(e.value), str(e.value)[:300]


def test_an_index_name_of_a_megabyte_is_shown_cut(ckpts: dict[str, Path], tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(ckpts["llama"], ck)
    index = json.loads((ck / "model.safetensors.index.json").read_text())
    fn = next(iter(index["weight_map"].values()))
    index["weight_map"][BIG] = fn
    (ck / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SpecbindError) as e:
        specbind.open(ck)
    assert len(str(e.value)) < 1000 and "(1048576 characters)" in str(e.value), str(e.value)[:300]


def test_cli_and_api_arguments_of_a_megabyte_are_shown_cut(
    ckpts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from specbind.cli import EXIT, main

    for argv in (["--set", f"hidden={BIG}"], ["--set", BIG]):
        assert main(["audit", str(ckpts["llama"]), *argv]) == EXIT["usage"]
        (line,) = capsys.readouterr().err.splitlines()
        assert len(line) < 1000 and "(1048576 characters)" in line, line[:300]
    opened = specbind.open(ckpts["llama"])
    for call in (
        lambda: opened.bind(tp_size=BIG),
        lambda: opened.bind(quant_output=[BIG]),
        lambda: opened.bind(mtp=BIG),
    ):
        with pytest.raises(SpecbindError) as e:
            call()
        assert len(str(e.value)) < 1000, str(e.value)[:300]
