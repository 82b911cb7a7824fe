"""specbind core: the spec IR, shape algebra, dtypes, errors and pure shard planning.

Invariant: nothing here does I/O or imports ``runtime``, ``generator`` or ``generated``; the
arrows run generator -> core <- runtime <- generated.
"""
