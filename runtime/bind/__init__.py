"""Bind a checkpoint: the names-only preamble, then every layer through the generated binders.

- ``preamble``: the checkpoint under the specs' names, its layout and each slot's quantization;
- ``bind``: every slot of every layer and the model-level tensors, all or nothing;
- ``bind_options``: the options one bind carries (the CLI's flags, the API's keywords);
- ``to_torch``: bound arrays handed to torch with the field's dtype.

Imports every wing below it (``io``, ``binder``, ``layout``, ``quant``).
"""
