"""What generated binders call: the one face of runtime that generated code imports.

Every name generated code uses of runtime is imported here and only here
(``from specbind.runtime.binder import ...``; ``tests/tools/test_architecture.py`` refuses any other
runtime import in generated/). The wing's modules:

- ``checks``: the strict checks every binder runs (census, dtype, shape, bytes);
- ``tp``: a rank's bytes of each planned tensor (``ShardedSource``);
- ``ops``, ``ops_cupy``, ``backends``: the transform ops on the host or a CUDA device, and
  where bound weights live;
- ``shapes``: the same ops on shapes alone, for a reload;
- ``quant``, ``quant_finite``, ``quant_numerics``: quantized linears' companions, the finite
  check, and the dequant / swizzle numerics;
- ``tables``: the types of the generated tables (``ModelTable``, ``BlockEntry``, ``Registry``).

Invariants: this wing imports only ``core`` and ``runtime.io``; nothing here reads config.json
or decides which modules a checkpoint quantized (``runtime.layout``, ``runtime.quant`` above).
Trap: importing any module of the wing runs this file, so the whole wing loads at once; every
binder module needs all of it anyway (NumPy, ml_dtypes), and CuPy still loads only on use.
"""

from specbind.runtime.binder import ops as numpy_ops
from specbind.runtime.binder.backends import NUMPY, Backend
from specbind.runtime.binder.checks import (
    Array,
    BindReport,
    bind_tensors,
    check_dims,
    members,
    require,
    rules_in,
)
from specbind.runtime.binder.ops import Ops
from specbind.runtime.binder.quant import (
    LayerQuant,
    QuantFields,
    check_shared,
    companion_fields,
    for_transforms,
    quantize_rules,
)
from specbind.runtime.binder.quant_finite import check_finite
from specbind.runtime.binder.tables import (
    BlockEntry,
    EngineTable,
    ModelEntry,
    ModelTable,
    Registry,
)
from specbind.runtime.binder.tp import ShardedSource
from specbind.runtime.io.source import TensorSource

__all__ = [
    "NUMPY",
    "Array",
    "Backend",
    "BindReport",
    "BlockEntry",
    "EngineTable",
    "LayerQuant",
    "ModelEntry",
    "ModelTable",
    "Ops",
    "QuantFields",
    "Registry",
    "ShardedSource",
    "TensorSource",
    "bind_tensors",
    "check_dims",
    "check_finite",
    "check_shared",
    "companion_fields",
    "for_transforms",
    "members",
    "numpy_ops",
    "quantize_rules",
    "require",
    "rules_in",
]
