"""``python -m specbind`` (and ``torchrun -m specbind``) is the ``specbind`` CLI."""

from specbind.cli import entry

entry()
