"""specbind: spec-driven, strict tensor binders for inference engines.

The API::

    import specbind

    ck = specbind.open("/models/GLM-5.3-Flash")        # index, headers, config.json; no bytes
    ck.audit()                                          # the census, as `specbind audit --json`
    ck.plan(tp_size=8, ep_size=8)                       # every rank's shapes and bytes
    m = ck.bind(tp_rank=0, tp_size=8, backend="torch")  # this rank's share, as torch tensors
    ck.bind(quant_output="dequantized")                 # the `bind` flags, or options=BindOptions
    m.layers[3].slots["mlp"].tensors["w13"]  # [experts_r, 2·expert_intermediate_r, hidden]
    m.globals.tensors["lm_head"] if m.globals else None
    specbind.open_bound("rank-0.safetensors", tp_rank=0)  # a `bind --out` file loaded back
    ck.bind(into=specbind.Arena())  # every field in one host arena, each byte written once

Everything installs under this one namespace: ``specbind.core`` (spec IR, shape algebra,
planning), ``specbind.generator``, ``specbind.generated``, ``specbind.runtime``, plus the specs,
templates and kernel sources as package data. In the repository those folders sit at the top
level and ``specbind/`` links to them; the wheel holds real copies.
"""

from typing import TYPE_CHECKING, Any

from specbind.api import (
    BoundLayer,
    BoundModel,
    BoundSlot,
    Checkpoint,
    open,
    open_bound,
)
from specbind.runtime.bind.bind_options import BindOptions
from specbind.version import __version__

if TYPE_CHECKING:
    from specbind.runtime.binder.backends import Arena

__all__ = [
    "Arena",
    "BindOptions",
    "BoundLayer",
    "BoundModel",
    "BoundSlot",
    "Checkpoint",
    "__version__",
    "open",
    "open_bound",
]


def __getattr__(name: str) -> Any:
    """``specbind.Arena`` on first use: importing it loads NumPy, which ``import specbind``
    does not."""
    if name == "Arena":
        from specbind.runtime.binder.backends import Arena

        return Arena
    raise AttributeError(f"module 'specbind' has no attribute {name!r}")
