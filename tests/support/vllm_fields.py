"""The config field review of the vLLM layouts: for each row's checkpoint
(tests/support/vllm_rows.py ``ROWS``), which config.json fields decide a parameter vLLM's own
model class builds, measured by vLLM itself (tests/vllm/fields_worker.py), never listed.

The candidates are every top-level field of the row's config.json whose value is a bool or a
whole number (tests/support/config_fields.py ``flipped``: a bool negated, a number + 1); each
is flipped alone (``flipped_folders``) and the parameters vLLM builds (names, shapes) compared with the unflipped
build's. ``review(rows, tmp)`` returns {model: {"base": None or vLLM's error, field: None (the
same parameters), "decides: ..." or "refused: ..."}, "bind": {field: None or the refusal}}
and the ``vllm_proofs.Report`` of what came from the cache. The bind side is specbind's
``bind_for_engine`` (vLLM, tp 1) on the same folder, for
each field that decides a vLLM parameter, then specbind's ``engine.fill`` into parameters of
the names, shapes and dtypes vLLM's class builds from that config (what the loader does once
vLLM has built the model): "bind: ..." a refusal before vLLM builds anything, "fill: ..." one
at load, None where both take it (the bound fields are what vLLM's class holds). Results are cached by content with the proofs' (tests/support/
vllm_cache.py, kind ``FIELDS``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import vllm_venv
from config_fields import flipped
from vllm_proofs import Report, cached_rows
from vllm_rows import VllmRow

WORKER = vllm_venv.REPO / "tests" / "vllm" / "fields_worker.py"
UNFLIPPED = "(unflipped)"
FIELDS = "config fields flipped one at a time: the parameters vLLM's model class builds"


def flipped_folders(ckpt: Path) -> dict[str, Path]:
    """Per candidate field of the checkpoint's config.json, a folder beside it holding the
    checkpoint with that field alone flipped: config.json rewritten, every other file a hard
    link (no bytes copied; the vLLM worker builds from it, the bind side binds it).
    Trap: hard links, not symbolic ones: specbind refuses a file that resolves outside its
    checkpoint folder, and every flip would be refused for that alone."""
    import os

    config = json.loads((ckpt / "config.json").read_text())
    out = {}
    for field, value in sorted(config.items()):
        if flipped(value) is None:
            continue
        folder = ckpt.parent / f"{ckpt.name}-fields" / field
        folder.mkdir(parents=True)
        for f in ckpt.iterdir():
            if f.name != "config.json":
                os.link(f, folder / f.name)
        (folder / "config.json").write_text(json.dumps(config | {field: flipped(value)}))
        out[field] = folder
    return out


def bind_side(
    ckpt: Path, folders: dict[str, Path], engine: dict[str, Any]
) -> dict[str, str | None]:
    """Per field that decides a vLLM parameter, None where its flipped folder is bound
    (``bind_for_engine``) and filled into the parameters vLLM's class builds from it
    (``engine.fill``), else "bind: " or "fill: " and the refusal; under ``UNFLIPPED`` the
    checkpoint itself bound and filled into vLLM's build of its own config, which must hold
    (so a fill refusal of a flip is the flip's, never a harness whose fills all fail)."""
    import torch

    from specbind.core.errors import SpecbindError
    from specbind.engine import bind_for_engine, fill

    def refusal(path: Path, built: dict[str, Any] | None) -> str | None:
        try:
            fields = bind_for_engine(path, "vllm", tp_size=1, tp_rank=0)
        except SpecbindError as e:
            return f"bind: {e}"
        if built is None:
            return None
        params = {n: torch.empty(s, dtype=getattr(torch, d)) for n, (s, d) in built.items()}
        try:
            fill("vllm", params, fields)
        except SpecbindError as e:
            return f"fill: {e}"
        return None

    out: dict[str, str | None] = {UNFLIPPED: refusal(ckpt, engine.get("base_built"))}
    for field, built in engine.get("built", {}).items():
        out[field] = refusal(folders[field], built)
    return out


def review(rows: tuple[VllmRow, ...], tmp: Path) -> tuple[dict[str, Any], Report]:
    def job(ckpt: Path) -> dict[str, Any]:
        return {"flips": {f: str(p) for f, p in flipped_folders(ckpt).items()}}

    def finish(ckpt: Path, j: dict[str, Any], engine: dict[str, Any]) -> dict[str, Any]:
        folders = {f: Path(p) for f, p in j["flips"].items()}
        return engine | {"bind": bind_side(ckpt, folders, engine)}

    return cached_rows(rows, FIELDS, 1, tmp, WORKER, "the vLLM config field review", job, finish)
