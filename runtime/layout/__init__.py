"""Where a checkpoint's tensors belong, from names and config.json alone (no tensor bytes).

- ``config``: every read of config.json's fields (geometry, flags, per-layer lists, counts);
- ``slots``: each name's layer, slot and block, the model-level tensors, the unbound ones.

Imports ``core``, ``runtime.io`` and ``runtime.binder`` (the generated tables' types).
"""
