"""The package's version, one constant: what ``specbind --version`` prints and what every JSON
output carries as ``specbind_version``.

Invariant: equal to ``[project] version`` in pyproject.toml (tests/tools/test_cli_glance.py
checks it).
Trap: read from here, never through ``importlib.metadata``: that import costs every start ~25 ms,
and in a checkout run through PYTHONPATH it would name whatever copy is installed instead.
"""

__version__ = "0.1.0"
