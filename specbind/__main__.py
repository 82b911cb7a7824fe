"""``python -m specbind`` (and ``torchrun -m specbind``) is the ``specbind`` CLI."""

from specbind.runtime.cli import entry

entry()
