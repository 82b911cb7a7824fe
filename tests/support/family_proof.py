"""One family's proof material, made once per test session: the checkpoint its own
transformers class writes, the module loaded back in float64, and binds cached per rank.

``ProofContext.config`` is the written config.json (transformers fills its defaults, such as
head_dim), the source of every unit size the reference rules read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from family_table import Family
from hf_random import write_random

from specbind.generated import MODELS
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir


@dataclass
class ProofContext:
    row: Family
    path: Path
    _model: Any = None
    _binds: dict[tuple[int, int, int, int], BindResult] = field(default_factory=dict)

    @property
    def table(self) -> Any:
        return MODELS[self.row.model]

    @property
    def config(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.path / "config.json").read_text())
        return loaded

    @property
    def model(self) -> Any:
        """The checkpoint as transformers loads it: float64 (every stored value exactly), eager
        attention and experts, eval mode."""
        if self._model is None:
            import torch
            import transformers

            cls = getattr(transformers, self.row.hf_class)
            self._model = cls.from_pretrained(  # eager experts: grouped_mm has no float64
                self.path, dtype=torch.float64, attn_implementation="eager",
                experts_implementation="eager",
            ).eval()  # fmt: skip
        return self._model

    def layer(self, i: int) -> Any:
        return self.model.get_submodule(self.row.layers_path)[i]

    def bind(self, tp: int, r: int, ep: int = 1, e: int = 0) -> BindResult:
        if (tp, r, ep, e) not in self._binds:
            self._binds[tp, r, ep, e] = bind_checkpoint(
                CheckpointDir(self.path), self.table, tp_size=tp, tp_rank=r, ep_size=ep,
                ep_rank=e, progress=False,
            )  # fmt: skip
        return self._binds[tp, r, ep, e]

    def fields(self, tp: int, r: int, ep: int = 1, e: int = 0) -> dict[str, Any]:
        """Rank (r, e)'s bound fields by ``--out`` name, as float64 (exact widening)."""
        return {
            k: np.asarray(a).astype(np.float64)
            for k, (_, a) in self.bind(tp, r, ep, e).fields().items()
        }

    def layer_fields(self, tp: int, r: int, i: int) -> dict[str, Any]:
        """Rank r's fields of layer ``i`` by ``slot.field``."""
        head = f"layers.{i}."
        return {k[len(head) :]: v for k, v in self.fields(tp, r).items() if k.startswith(head)}


def write_family(row: Family, path: Path, config: dict[str, Any] | None = None) -> Path:
    """``row``'s checkpoint (or one of ``config``), written by its own transformers class."""
    import transformers

    write_random(
        getattr(transformers, row.hf_class), getattr(transformers, row.config_class),
        row.config if config is None else config, path, re.compile(row.f32),
    )  # fmt: skip
    return path
