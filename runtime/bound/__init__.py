"""The ``--out`` format: a rank's bound file written, read back and checked.

- ``bound_format``: the file's metadata record (``BoundMeta``), encoded and decoded here only;
- ``stream_out``: the one writer, as the bind goes;
- ``reload``: the one reader (``specbind.open_bound``, ``bind --from``);
- ``bound_check``: what the file must hold, from the spec alone.

Imports ``io``, ``binder``, ``layout`` and ``bind`` (the writer's types only).
"""
