"""``python -m benchmarks``: the benchmark suite's command line (``benchmarks/cli.py``)."""

import sys

from benchmarks.cli import main

sys.exit(main())
