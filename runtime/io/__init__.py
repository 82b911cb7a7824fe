"""Files in and out: the bottom wing of runtime, importing only ``core``.

- ``source``: the tensor-source interface a binder reads one layer through (raw bytes, spans);
- ``safetensors_file``: a strict, lazy reader of one ``.safetensors`` file;
- ``checkpoint``: a checkpoint directory, its index, shards and config files;
- ``atomic``: a file that appears whole or not at all (the generator's writes use it too);
- ``out_path``: where an output file may be written;
- ``progress``: progress bars on stderr.

Invariant: nothing here knows a spec, a block or a model; it moves bytes and names.
"""
