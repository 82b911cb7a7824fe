"""The Python API checks its arguments' types at the door: a wrong type is one ``SpecbindError``
line naming the function, the argument and what it is, never a raw ``TypeError``,
``AttributeError`` or ``ValueError`` from deep inside ``pathlib``, ``re`` or the binder."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import specbind
from specbind.core.errors import SpecbindError
from specbind.generated import MODELS
from specbind.synth import synth, tiny_values

LLAMA = MODELS["llama"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("door") / "ll"
    synth(LLAMA, out, tiny_values(LLAMA), layers=2, seed=4)
    return out


def misuses(ck: Path) -> dict[str, tuple[Callable[[], Any], str]]:
    """Each misuse: the call, and the start of the one line it must raise."""
    opened: Any = None if not ck.exists() else specbind.open(ck)
    a: Any = None  # the calls go around the type hints on purpose, as a caller's code may
    return {
        "bind(device=0)": (
            lambda: opened.bind(device=a or 0),
            "bind: device 0: expected 'cpu', 'cuda' or 'cuda:N' (a str), or None",
        ),
        "bind(into=object())": (
            lambda: opened.bind(into=a or object()),
            "bind: into has type object; expected None or a specbind.Arena()",
        ),
        "bind(backend=['numpy'])": (
            lambda: opened.bind(backend=a or ["numpy"]),
            "bind: unknown backend ['numpy'] (numpy, cupy or torch)",
        ),
        "open(None)": (
            lambda: specbind.open(a),
            "open: path None has type NoneType; expected a path as a str or os.PathLike",
        ),
        "open(123)": (
            lambda: specbind.open(a or 123),
            "open: path 123 has type int; expected a path as a str or os.PathLike",
        ),
        "open(b'...')": (
            lambda: specbind.open(a or os.fsencode(ck)),
            f"open: path {os.fsencode(ck)!r} has type bytes; expected a path as a str",
        ),
        "open(NUL)": (
            lambda: specbind.open(f"{ck}\0x"),
            f"open: path {str(ck) + chr(0) + 'x'!r} holds a NUL byte; no file is named so",
        ),
        "open(Path NUL)": (
            lambda: specbind.open(Path(f"{ck}\0x")),
            f"open: path {str(ck) + chr(0) + 'x'!r} holds a NUL byte; no file is named so",
        ),
        "open(overrides='hidden=40')": (
            lambda: specbind.open(ck, overrides=a or "hidden=40"),
            "open: overrides='hidden=40' has type str; expected a mapping of geometry names",
        ),
        "open(overrides={1: 2})": (
            lambda: specbind.open(ck, overrides=a or {1: 2}),
            "open: overrides key 1 is not a str (a geometry name)",
        ),
        "open(model=1)": (
            lambda: specbind.open(ck, model=a or 1),
            "open: model=1 has type int; expected a str or None",
        ),
        "open_bound(None)": (
            lambda: specbind.open_bound(a),
            "open_bound: path None has type NoneType; expected a path as a str or os.PathLike",
        ),
        "open_bound(NUL)": (
            lambda: specbind.open_bound("x\0.safetensors"),
            "open_bound: path 'x\\x00.safetensors' holds a NUL byte",
        ),
        "open_bound(copy='yes')": (
            lambda: specbind.open_bound(ck / "model.safetensors", copy=a or "yes"),
            "open_bound: copy='yes' is not a bool (True or False)",
        ),
    }


CASES = list(misuses(Path("/nowhere")))  # the cases are the misuses listed above


@pytest.mark.parametrize("case", CASES)
def test_an_api_argument_of_the_wrong_type_is_refused_in_one_line_naming_it(
    ckpt: Path, case: str
) -> None:
    call, line = misuses(ckpt)[case]
    with pytest.raises(Exception) as got:
        call()
    assert isinstance(got.value, SpecbindError), f"{case}: raw {got.value!r}"
    message = str(got.value)
    assert "\n" not in message and message.startswith(line), message


def test_an_api_argument_of_a_megabyte_is_shown_cut(ckpt: Path) -> None:
    huge = "x" * (1 << 20)
    for call in (
        lambda: specbind.open(ckpt).bind(device=huge),
        lambda: specbind.open(ckpt, model=huge),
        lambda: specbind.open(ckpt, overrides={"hidden": huge}),  # type: ignore[dict-item]
    ):
        with pytest.raises(SpecbindError) as got:
            call()
        assert len(str(got.value)) < 1000, str(got.value)[:300]
