"""``python -m runtime`` is the ``specbind`` CLI."""

from runtime.cli import main

raise SystemExit(main())
