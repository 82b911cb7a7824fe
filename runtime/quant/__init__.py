"""Which quantization a checkpoint uses, read from its own config files: the scheme, and per
slot of each layer which linears it stores quantized.

- ``scheme``: the scheme a checkpoint's config announces and the modules it excludes;
- ``layers``: per block and layer, the ``LayerQuant`` that binding takes.

Imports ``core``, ``runtime.io``, ``runtime.binder`` and ``runtime.layout``; how quantized
fields bind is ``runtime.binder.quant``, below.
"""
