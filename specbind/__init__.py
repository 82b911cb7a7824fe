"""specbind: spec-driven, strict tensor binders for inference engines.

Everything installs under this one namespace: ``specbind.core`` (spec IR, shape algebra,
planning), ``specbind.generator``, ``specbind.generated``, ``specbind.runtime``, plus the specs,
templates and kernel sources as package data. In the repository those folders sit at the top
level and ``specbind/`` links to them; the wheel holds real copies.
"""
