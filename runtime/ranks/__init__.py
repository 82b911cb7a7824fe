"""Many ranks binding one model: every rank agrees first, then binds its shard, and together
they prove the shards are the model.

- ``comm``: the three metadata collectives the ranks use;
- ``agreement``: what every rank must agree on before any binds;
- ``byte_coverage``: which source bytes each rank reads, and the proof they cover the model;
- ``distributed``: the whole run (``torchrun ... specbind bind --out-dir``).

The top wing: imports every other.
"""
